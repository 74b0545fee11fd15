// Package wmpubsub is a transport on any Watermill Pub/Sub: it takes a
// message.Publisher and a message.Subscriber per queue and gives the bus
// its inbox, outbox, retries and dead letters on top of them.
//
// What the adapter cannot know about a Pub/Sub is declared in Config, by
// the user or by a preset (wmamqp for watermill-amqp v3 on RabbitMQ, wmnats
// for watermill-nats v2 on NATS JetStream, wmredis for
// watermill-redisstream, wmkafka for watermill-kafka v3): how the bus's
// destinations map onto topics (Topics), whether a nacked message comes
// back (Semantics), how to tell a broker that is down from a message
// it refuses (Health), and, where the Pub/Sub can tell, whether a queue's
// topic exists (QueueExists: a send to a missing queue fails as unroutable)
// and how to delete a reply queue's topic (DeleteQueue). Each preset is its own package, so a service links
// only the client it uses.
//
// # Topology
//
// A message published to type T ("exchange:T") goes to topic Topics.Type(T);
// a message sent to queue Q ("queue:Q", also dead letters to an endpoint's
// error queue and delayed redeliveries) goes to topic Topics.Queue(Q). The
// subscriber of an endpoint (Config.Subscriber, called with the endpoint's
// name) consumes the endpoint's own topic, one topic per consumed type and
// one per extra binding, all in one consumer group named after the
// endpoint: every endpoint gets its copy of a type, and the instances of
// one endpoint compete for it.
//
// # Wire mapping
//
// The message id is the Watermill UUID (the `_watermill_message_uuid` the
// stock marshalers write); the type, content type and correlation id travel
// in metadata under the bus's header names (BW-MessageType, content-type,
// correlation-id). A message from a Watermill-native publisher without
// BW-MessageType is typed by its CQRS `name` metadata, else by the type
// topic it came through. A message without a UUID reaches the endpoint
// with an empty id, and the endpoint's MissingMessageID policy decides
// (dead letter by default): an id is never invented.
//
// Delays need nothing from the Pub/Sub: a delayed redelivery waits in the
// outbox (available_at) and is sent to the endpoint's topic when due. Dead
// letters are sent to the error queue's topic.
//
// This API may change, as the transport seam may.
package wmpubsub
