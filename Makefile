# BareWire for Go — developer tasks.
GO ?= go
STATICCHECK = honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all test test-short lint vet staticcheck bench demo check-docs

all: lint test

## test: race-enabled tests; integration tests need BAREWIRE_TEST_POSTGRES_DSN and BAREWIRE_TEST_AMQP_URL
test:
	$(GO) test -race -count=1 -timeout 12m ./...

## test-short: embedded-only tests (no services)
test-short:
	$(GO) test -race -count=1 -short ./...

vet:
	$(GO) vet ./...

staticcheck:
	$(GO) run $(STATICCHECK) ./...

## lint: go vet and staticcheck (pinned)
lint: vet staticcheck

## bench: hot-path micro-benchmarks
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

## demo: the main job on the embedded default
demo:
	$(GO) run ./samples/inbox-deduplication -demo

## check-docs: every sample builds; doc snippets match their sources
check-docs:
	$(GO) build ./samples/... ./cmd/... 2>/dev/null || $(GO) build ./samples/...
	$(GO) run ./internal/tools/docsnippets
