// Package wmnats is the wmpubsub preset for NATS JetStream through
// watermill-nats v2: one stream per topic (created on Start), one durable
// consumer per endpoint and topic whose deliver group is shared by the
// endpoint's instances, explicit acks, and the message id as Nats-Msg-Id
// so that JetStream's duplicate window drops a message published twice.
//
// A nack is a JetStream Nak: the message is delivered again at once, to
// any instance of the endpoint, while the messages behind it keep flowing.
// A message not acknowledged within AckWait (a consumer that hangs, an
// instance that dies) is delivered again by the server; the inbox turns
// the second delivery into a duplicate (or hands it back while the first
// still holds its lock), so the effect happens once.
package wmnats
