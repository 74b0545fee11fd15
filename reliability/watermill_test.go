//go:build linux

package reliability_test

import (
	"testing"

	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/reliability"
)

// watermillEnv returns the servers of the Watermill preset transport.
func watermillEnv(t *testing.T, transport string) reliability.Env {
	env := reliability.Env{PostgresDSN: testenv.PostgresDSN(t)}
	switch transport {
	case reliability.TransportWMAMQP:
		env.AMQPURL = testenv.AMQPURL(t)
		env.Broker = &reliability.Broker{URL: env.AMQPURL, Ctl: reliability.DefaultRabbitmqctl()}
	case reliability.TransportWMNATS:
		env.NATSURL = testenv.NATSURL(t)
	case reliability.TransportWMRedis:
		env.RedisAddr = testenv.RedisAddr(t)
	}
	return env
}

// TestReliabilityWatermill runs the fault-injection profile (short by
// default: reliability.ForWatermill sizes it for CI, about a minute per
// preset; long with BAREWIRE_RELIABILITY_PROFILE=long) on each Watermill
// preset: watermill-amqp on RabbitMQ, JetStream, Redis Streams. Consumer
// kills, a relay killed between confirm and mark, a producer kill, a
// freeze past the inbox lock with the connections cut (stop-cont),
// connections cut at the proxy (broker-close) and the producer's
// re-published ids: it fails on any lost, doubled or phantom effect, on
// dead letters, and on anything left undelivered. `make reliability
// TRANSPORT=wmnats` runs one (subtest wmnats).
func TestReliabilityWatermill(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection suite: runs without -short")
	}
	skipPoison(t)
	prof, err := reliability.ProfileFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range reliability.WatermillTransports {
		t.Run(tr, func(t *testing.T) {
			runProfile(t, reliability.ForWatermill(prof, tr), watermillEnv(t, tr))
		})
	}
}

// TestPoisonWatermill is TestPoison on each Watermill preset (no raw AMQP
// classes): every poison message dead-lettered with its reason, refused
// at publish or parked within the bound, with no effect, and good
// traffic's latency within the bound.
func TestPoisonWatermill(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection suite: runs without -short")
	}
	for _, tr := range reliability.WatermillTransports {
		t.Run(tr, func(t *testing.T) {
			runProfile(t, reliability.ForWatermill(reliability.PoisonProfileFromEnv(), tr), watermillEnv(t, tr))
		})
	}
}
