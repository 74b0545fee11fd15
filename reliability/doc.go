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
// They need BAREWIRE_TEST_POSTGRES_DSN, and on RabbitMQ
// BAREWIRE_TEST_AMQP_URL (see internal/testenv); for two of the faults,
// rabbitmqctl and a command that restarts PostgreSQL (see
// DefaultRabbitmqctl and DefaultPGRestart).
package reliability
