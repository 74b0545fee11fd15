# BareWire for Go — developer tasks.
GO ?= go
STATICCHECK = honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all test test-embedded test-integration test-faults test-ordering-long lint vet staticcheck bench demo check-docs fuzz-short

all: lint test

## test: every suite, as CI runs it (.ci/run): test-integration, then test-faults. Without the
## BAREWIRE_TEST_* variables the integration tests skip (under CI=true a skip fails).
test: test-integration test-faults

## test-embedded: what a fresh clone runs with nothing installed: the race-enabled tests with
## -short and the services' variables cleared (the in-process transport and SQLite only).
SERVICE_VARS = BAREWIRE_TEST_POSTGRES_DSN BAREWIRE_TEST_AMQP_URL BAREWIRE_TEST_NATS_URL BAREWIRE_TEST_REDIS_ADDR BAREWIRE_TEST_AMQP_CLUSTER_URLS
test-embedded:
	env $(foreach v,$(SERVICE_VARS),-u $(v)) CI= $(GO) test -race -count=1 -short ./...

## test-integration: every package but the reliability suite, race-enabled, against the
## services named by BAREWIRE_TEST_POSTGRES_DSN, BAREWIRE_TEST_AMQP_URL, BAREWIRE_TEST_NATS_URL
## and BAREWIRE_TEST_REDIS_ADDR (CI sets all four; see README). The wmamqp conformance suite,
## its publisher's connection-cut test and its frozen-broker test, and the wmnats conformance
## suite, run once more without -race: they are skipped under -race, as watermill-amqp
## v3.0.2's reconnect and watermill-nats v2.1.3's unsubscribe race.
test-integration:
	$(GO) test -race -count=1 -timeout 12m $$($(GO) list ./... | grep -v /reliability)
	$(GO) test -count=1 -timeout 3m -run '^(TestConformance|TestPublisherSurvivesConnectionCuts|TestPublishBoundedWhileTheBrokerDoesNotAnswer)$$' ./transport/wmpubsub/wmamqp/ ./transport/wmpubsub/wmnats/

## test-faults: the reliability suite, on its own because its faults would break tests running
## beside it: it kills and freezes its own child processes and cuts their broker and database
## connections. It includes the poison-short profile on both transports (TestPoison,
## TestPoisonPostgresTransport), the short and poison-short profiles on the Watermill presets
## (TestReliabilityWatermill, TestPoisonWatermill: about 7 minutes for the three), the 20 s
## interaction profile (TestInteractions), and last the short cluster profile
## (TestReliabilityCluster, 3-4 minutes) on the 3-node cluster named by
## BAREWIRE_TEST_AMQP_CLUSTER_URLS (.ci/run starts it; without the variable it skips outside CI).
## One fault restarts the machine's PostgreSQL cluster (pg_ctlcluster): it runs only when
## PG_RESTART=1, which CI=true sets; otherwise the profile skips that fault and says so.
PG_RESTART ?= $(if $(CI),1,$(BAREWIRE_RELIABILITY_PG_RESTART))
test-faults:
	@if [ "$(PG_RESTART)" = 1 ]; then \
		echo "test-faults: PG_RESTART=1: one fault restarts this machine's PostgreSQL cluster (pg_ctlcluster ... restart)"; \
	else \
		echo "test-faults: the PostgreSQL restart fault is skipped (PG_RESTART=1 runs it; it restarts this machine's PostgreSQL)"; \
	fi
	BAREWIRE_RELIABILITY_PG_RESTART=$(PG_RESTART) $(GO) test -race -count=1 -timeout 15m -skip 'Watermill|^TestReliabilityCluster$$' ./reliability/...
	$(GO) test -race -count=1 -timeout 15m -run 'Watermill' ./reliability/
	$(GO) test -race -count=1 -timeout 12m -run '^TestReliabilityCluster$$' ./reliability/

## test-ordering-long: the per-key ordering test at full size (100 keys x 200 messages, 3 instances, SIGKILLs)
test-ordering-long:
	BW_ORDERING_PER=200 $(GO) test -count=1 -timeout 15m -run '^TestOrderedAcrossInstancesWithKills$$' -v ./bus/

## fuzz-short: each go test -fuzz target for FUZZTIME (10s) after its seed corpus (the
## poison cases): the inbound conversion and dispatch, and the publish envelope
## (against the stores' limits and against AMQP's encoding).
## A failing input is written to the package's testdata/fuzz; re-run it with go test -run.
FUZZTIME ?= 10s
FUZZ_TARGETS = ./transport/rabbitmq/:FuzzFromDelivery ./bus/:FuzzDispatch ./bus/:FuzzEnvelope ./bus/:FuzzEnvelopeAMQP
fuzz-short:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($${t%%:*}) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) "$${t%%:*}"; \
	done

vet:
	$(GO) vet ./...

staticcheck:
	$(GO) run $(STATICCHECK) ./...

## lint: go vet and staticcheck (pinned)
lint: vet staticcheck

## bench: hot-path micro-benchmarks (bus, transport/rabbitmq, gormstore), then, when
## BAREWIRE_TEST_POSTGRES_DSN and BAREWIRE_TEST_AMQP_URL are set, the load tool
## (cmd/barewire-bench; BENCH_ARGS overrides its flags, e.g. BENCH_ARGS='-scenario e2e -duration 30s')
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./bus/ ./transport/rabbitmq/ ./gormstore/
	@if [ -n "$$BAREWIRE_TEST_POSTGRES_DSN" ] && [ -n "$$BAREWIRE_TEST_AMQP_URL" ]; then \
		GO=$(GO) ./cmd/barewire-bench/build.sh bin/barewire-bench && \
		bin/barewire-bench $${BENCH_ARGS:--scenario all -backlog 100000 -plot bin/benchmarks-latency.png}; \
	else \
		echo "bench: load tool skipped; set BAREWIRE_TEST_POSTGRES_DSN and BAREWIRE_TEST_AMQP_URL to run cmd/barewire-bench"; \
	fi

## demo: the main job on the embedded default
demo:
	$(GO) run -tags embedded ./samples/inbox-deduplication -demo

## check-docs: every sample builds, with and without -tags embedded; doc snippets match their
## sources; every Go identifier named in backticks in the docs exists
check-docs:
	$(GO) build ./samples/... ./cmd/... 2>/dev/null || $(GO) build ./samples/...
	$(GO) build -tags embedded ./samples/...
	$(GO) run ./internal/tools/docsnippets
	$(GO) run ./internal/tools/docidents

## test-cluster: start the 3-node RabbitMQ cluster beside the machine's broker
## (scripts/rabbitmq-cluster.sh, AMQP ports 5681-5683) and run TestClusterNodeLoss on it (needs
## BAREWIRE_TEST_POSTGRES_DSN and BAREWIRE_TEST_AMQP_URL); `scripts/rabbitmq-cluster.sh stop` after.
## The fault profile on the cluster is `make reliability TRANSPORT=cluster`.
.PHONY: test-cluster
test-cluster:
	scripts/rabbitmq-cluster.sh start
	BAREWIRE_TEST_AMQP_CLUSTER_URLS=$$(scripts/rabbitmq-cluster.sh urls) $(GO) test -race -count=1 -timeout 5m -run '^TestClusterNodeLoss$$' -v ./bus/

## reliability: fault-injection suite (PROFILE=short, the CI one, or PROFILE=long) on
## TRANSPORT=rabbitmq (the default: RabbitMQ + PostgreSQL, TestReliability; needs
## BAREWIRE_TEST_POSTGRES_DSN and BAREWIRE_TEST_AMQP_URL) or TRANSPORT=postgres (the
## PostgreSQL transport alone, TestReliabilityPostgresTransport; needs
## BAREWIRE_TEST_POSTGRES_DSN only), a Watermill preset, TRANSPORT=wmamqp, wmnats or
## wmredis (TestReliabilityWatermill/<preset>: watermill-amqp on RabbitMQ, JetStream,
## Redis Streams, each consumer's connections through a TCP proxy that broker-close and
## stop-cont cut; also BAREWIRE_TEST_NATS_URL / BAREWIRE_TEST_REDIS_ADDR; the short profile
## there is CI-sized, 1,500 messages, 1,000 on wmamqp), or TRANSPORT=cluster
## (TestReliabilityCluster: the 3-node cluster of scripts/rabbitmq-cluster.sh, started first
## if it is not running, with quorum queues; node kills and stops of the queues' leaders;
## BAREWIRE_TEST_AMQP_CLUSTER_URLS defaults to the script's URLs); prints the checker's
## summary last.
## PROFILE=poison (TestPoison / TestPoisonPostgresTransport; PROFILE=poison-short is the
## CI size, run by `make test`): no faults; good traffic in baseline, poison and baseline
## phases, 1.5 % of each poison class (consumer errors, Permanent, panics, aborted
## transactions, bad JSON, unknown types, oversized and invalid ids and headers, a send to
## a missing queue, raw AMQP bad ids) in the middle one; fails unless every poison message
## is dead-lettered with its reason, refused at publish or parked within 30 s with no
## effect, good traffic's p99 stays within 2x the baselines' (5x for poison-short) and no
## process reconnects.
## PROFILE=interactions (TestInteractions; its 20 s version runs in `make test`): three bus
## instances whose handlers publish, send, request, schedule and overrun their timeout, a
## producer, a canceller, a queue that nacks everything, and a seeded schedule of Stop and
## restart, dropped broker connections and PostgreSQL cut off; fails unless every message
## reaches its terminal state within 90 s and every Stop returns within its deadline + 3 s.
## BAREWIRE_INTERACTIONS_SEED=N replays a run's schedule; INTERACTIONS_DURATION (5m) its length.
.PHONY: reliability
PROFILE ?= short
TRANSPORT ?= rabbitmq
RELIABILITY_KIND = $(if $(filter poison poison-short,$(PROFILE)),TestPoison,TestReliability)
RELIABILITY_TEST = $(if $(filter postgres,$(TRANSPORT)),$(RELIABILITY_KIND)PostgresTransport,$(if $(filter rabbitmq,$(TRANSPORT)),$(RELIABILITY_KIND),$(if $(filter wmamqp wmnats wmredis,$(TRANSPORT)),$(RELIABILITY_KIND)Watermill/$(TRANSPORT),$(if $(filter cluster,$(TRANSPORT)),$(if $(filter TestPoison,$(RELIABILITY_KIND)),$(error PROFILE=$(PROFILE) has no cluster variant: use short or long),TestReliabilityCluster),$(error TRANSPORT=$(TRANSPORT): use rabbitmq, postgres, wmamqp, wmnats, wmredis or cluster)))))
# PROFILE=interactions: TestInteractions for INTERACTIONS_DURATION of load (seeded random
# schedules of features and faults on three in-process instances; see the test's comment).
INTERACTIONS_DURATION ?= 5m
ifeq ($(PROFILE),interactions)
RELIABILITY_TEST = TestInteractions
endif
RELIABILITY_CLUSTER = $(if $(filter cluster,$(TRANSPORT)),scripts/rabbitmq-cluster.sh start >/dev/null && BAREWIRE_TEST_AMQP_CLUSTER_URLS=$${BAREWIRE_TEST_AMQP_CLUSTER_URLS:-$$(scripts/rabbitmq-cluster.sh urls)},)
RELIABILITY_SUMMARY ?= $(or $(TMPDIR),/tmp)/barewire-reliability-$(TRANSPORT)-$(PROFILE).txt
reliability:
	@rm -f $(RELIABILITY_SUMMARY)
	@$(RELIABILITY_CLUSTER) BAREWIRE_INTERACTIONS_DURATION=$(INTERACTIONS_DURATION) BAREWIRE_RELIABILITY_PROFILE=$(PROFILE) BAREWIRE_RELIABILITY_SUMMARY=$(RELIABILITY_SUMMARY) $(if $(filter TestPoison,$(RELIABILITY_KIND)),,BAREWIRE_RELIABILITY_PG_RESTART=1) \
		$(GO) test -race -count=1 -v -run '$(RELIABILITY_TEST)$$' -timeout $(if $(filter long,$(PROFILE)),8h,15m) ./reliability/; \
		status=$$?; echo; \
		if [ -f $(RELIABILITY_SUMMARY) ]; then cat $(RELIABILITY_SUMMARY); else echo "reliability: no summary was written (see the output above)"; fi; \
		exit $$status
