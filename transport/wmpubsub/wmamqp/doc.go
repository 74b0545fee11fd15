// Package wmamqp is the wmpubsub preset for RabbitMQ through watermill-amqp
// v3, for services that already run Watermill on RabbitMQ. Its topology
// and wire format are those of transport/rabbitmq, so services on either
// transport, and Watermill-native services using watermill-amqp's durable
// pub/sub config, share one broker: a durable fanout exchange per message
// type (the topic) bound to the queue of each endpoint consuming it; a
// send to a queue goes through the default exchange; the message id is the
// message_id property and the _watermill_message_uuid header; type,
// content type and correlation id are AMQP properties.
//
// Publisher confirms are on; watermill-amqp waits for each confirm before
// the next message (transport/rabbitmq pipelines them, and is several times
// faster: see docs/benchmarks.md). A nack requeues at the head of the
// queue. Choose transport/rabbitmq unless you need watermill-amqp itself.
package wmamqp
