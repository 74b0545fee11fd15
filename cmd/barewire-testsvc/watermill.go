package main

import (
	"fmt"
	"os"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmamqp"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmnats"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmredis"
)

// The Watermill presets the service can run on (-transport): watermill-amqp
// on the RabbitMQ at BAREWIRE_AMQP_URL, JetStream on the NATS server at
// BAREWIRE_NATS_URL, Redis Streams on the server at BAREWIRE_REDIS_ADDR.
// Messages go through the outbox and the relay, as on RabbitMQ.
const (
	transportWMAMQP  = "wmamqp"
	transportWMNATS  = "wmnats"
	transportWMRedis = "wmredis"
)

// isWatermill reports whether transport is one of the Watermill presets.
func isWatermill(transport string) bool {
	switch transport {
	case transportWMAMQP, transportWMNATS, transportWMRedis:
		return true
	}
	return false
}

// validateWatermill checks the settings of a Watermill preset.
func (c *config) validateWatermill(bad func(string, ...any)) {
	switch c.Transport {
	case transportWMAMQP:
		if c.AMQPURL == "" {
			bad("-transport wmamqp: no RabbitMQ URL: set BAREWIRE_AMQP_URL or -amqp-url")
		}
	case transportWMNATS:
		if os.Getenv("BAREWIRE_NATS_URL") == "" {
			bad("-transport wmnats: set BAREWIRE_NATS_URL (nats://host:4222)")
		}
	case transportWMRedis:
		if os.Getenv("BAREWIRE_REDIS_ADDR") == "" {
			bad("-transport wmredis: set BAREWIRE_REDIS_ADDR (host:6379)")
		}
	}
	if c.WMRedelivery < 100*time.Millisecond {
		bad("-wm-redelivery %v: use at least 100ms", c.WMRedelivery)
	}
}

// watermillFactory builds the preset's transport factory. The redelivery
// timeout (JetStream's AckWait, Redis's MaxIdleTime) is -wm-redelivery:
// how soon the message of a killed or frozen consumer comes to another.
// On Redis every incarnation is a consumer of its own in each group
// (instance name and pid), so that a restarted process's predecessor's
// pending entries are claimed like a departed consumer's.
func (c *config) watermillFactory(declare func(*endpoint.Endpoints)) (transport.Factory, error) {
	switch c.Transport {
	case transportWMAMQP:
		// The preset's prefetch (1): watermill-amqp handles one message
		// at a time per subscription, so more would only sit unacked.
		return wmamqp.New(c.AMQPURL, func(w *wmamqp.Config) { declare(&w.Endpoints) }), nil
	case transportWMNATS:
		return wmnats.New(os.Getenv("BAREWIRE_NATS_URL"), func(w *wmnats.Config) {
			declare(&w.Endpoints)
			w.AckWait = c.WMRedelivery
		}), nil
	case transportWMRedis:
		return wmredis.New(os.Getenv("BAREWIRE_REDIS_ADDR"), func(w *wmredis.Config) {
			declare(&w.Endpoints)
			w.Consumer = fmt.Sprintf("%s-%d", c.Instance, os.Getpid())
			w.MaxIdleTime = c.WMRedelivery
			w.ClaimInterval = max(c.WMRedelivery/4, 100*time.Millisecond)
			w.NackResendSleep = 100 * time.Millisecond
		}), nil
	}
	return nil, fmt.Errorf("-transport %q is not a Watermill preset", c.Transport)
}
