// Package wmredis is the wmpubsub preset for Redis Streams through
// watermill-redisstream: one stream per topic, one consumer group per
// endpoint (created from the start of the stream, so an endpoint started
// after a message was published still gets it), and a stable consumer name
// per instance.
//
// Redis has no redelivery of its own: a nack is resent by the subscriber in
// process after NackResendSleep, and a message an instance read but never
// acknowledged (the instance died, or its consumer took longer than
// MaxIdleTime) stays pending in the group until another subscription claims
// it (XPENDING + XCLAIM, every ClaimInterval, once it has been idle for
// MaxIdleTime). The inbox turns a claimed message that was in fact
// processed into a duplicate, so the effect happens once. Streams grow
// until trimmed: set MaxLen, or trim them yourself.
package wmredis
