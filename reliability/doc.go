// Package reliability is BareWire's fault-injection suite: a harness that
// builds and runs the test service (cmd/barewire-testsvc) as several
// processes against a real RabbitMQ and PostgreSQL, drives a workload,
// kills, freezes and disconnects those processes, restarts PostgreSQL, and
// then checks, with SQL over the run's tables, that every committed message
// had exactly one effect per consumer and that nothing was lost or
// published without its commit (see Check and Report).
//
// The go test entry points are in this package's tests: TestReliability
// runs the short profile (CI) or, with BAREWIRE_RELIABILITY_PROFILE=long,
// the long one (`make reliability PROFILE=long`), on RabbitMQ.
// TestReliabilityPostgresTransport runs the same profiles on the PostgreSQL
// transport (Profile.Transport, see ForPostgresTransport; `make reliability
// TRANSPORT=postgres`): no broker, db-close instead of broker-close, and
// relay-kill reported as skipped since no message goes through the outbox.
// TestReliabilityCluster runs them on a 3-node RabbitMQ cluster with
// quorum queues (ForCluster, Env.Cluster; `make reliability
// TRANSPORT=cluster`; BAREWIRE_TEST_AMQP_CLUSTER_URLS): node-kill and
// node-stop replace broker-close and stop-cont, and ClusterReport gives each
// process's reconnect and consuming-again times and the throughput around
// every node fault.
// They need BAREWIRE_TEST_POSTGRES_DSN, and on RabbitMQ
// BAREWIRE_TEST_AMQP_URL (see internal/testenv); for two of the faults,
// rabbitmqctl and a command that restarts PostgreSQL (see
// DefaultRabbitmqctl and DefaultPGRestart).
//
// The poison profile (PoisonProfile, `make reliability PROFILE=poison`;
// PoisonShortProfile in CI) checks liveness instead of surviving faults:
// TestPoison and TestPoisonPostgresTransport inject no fault, run good
// traffic in three phases (baseline, poison, baseline; Profile.Phases) and
// mix 1.5 % of every class of workload.PoisonClasses into the middle one:
// consumer errors (plain, a wrapped context.DeadlineExceeded, a wrapped
// *url.Error from net/http, each also wrapped in endpoint.Permanent),
// panics, aborted transactions (a failing statement whose error the
// consumer ignores: 25P02 at the inbox mark), malformed JSON, unknown
// types, oversized correlation id, header key and message id and NUL or
// invalid-UTF-8 ids at publish, the same bad ids from a plain amqp091
// client (RabbitMQ only), and a send to a queue that does not exist. The
// producer records every poison message in the poison table (with its
// error when the publish was refused); the consumers misbehave by the
// message's workload.HeaderPoisonClass. Besides the exactly-once checker
// (which leaves poison rows out), EvaluatePoison reports, per class, that
// every message reached its terminal state (workload.TerminalDeadLetter
// with the class's BW-Fault-Reason, without a retry for Permanent
// failures; TerminalRefused; TerminalRefusedOrParked) within
// PoisonBounds.Terminal (30 s) with no business effect; that no good
// message was dead-lettered; that good traffic's p99 latency during poison
// is within PoisonBounds.P99Ratio of the baselines' mean (2x; 5x in the
// short CI profile, whose phases are a dozen seconds on two shared cores;
// 12x there for the wmnats and wmredis presets, whose push subscriptions
// hold a good message behind a retrying poison one, or the baselines' mean
// plus PoisonBounds.P99Allowance, 1.5 s: ForWatermill);
// and that the processes lost no transport connection (the test service's
// "reconnects" counter).
package reliability
