// Package wmkafka is the wmpubsub preset for Kafka through watermill-kafka
// v3 (sarama): one topic per message type and per queue, one consumer group
// per endpoint, reading a new group from the oldest offset so that an
// endpoint started after a message was published still gets it.
//
// NOT TESTED AGAINST A BROKER: no Kafka server runs where BareWire's
// integration tests run, so this preset compiles and its naming is unit
// tested, but the conformance suite and the end-to-end tests have not been
// run on it. Run transport/transporttest against your cluster before you
// rely on it.
//
// Kafka acknowledges by offset: a message held by a slow consumer holds
// back its partition, and the instances of an endpoint compete per
// partition, not per message (Semantics.AckPerOffset). A nack is resent
// in process after NackResendSleep, blocking the partition meanwhile. The
// bus nacks only to hand a message back (a busy inbox entry, the database
// down, shutdown); failures are retried in process, delayed through the
// outbox and dead-lettered to the error queue's topic.
package wmkafka
