//go:build linux

package reliability_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/reliability"
)

// TestReliabilityCluster runs the fault profile (short by default, long
// with BAREWIRE_RELIABILITY_PROFILE=long) on the 3-node test cluster of
// scripts/rabbitmq-cluster.sh with quorum queues (reliability.ForCluster):
// the processes list every node, and the harness kills or stops the node
// that leads one of the run's queues and starts it again, besides killing
// consumers, the relay and the producer. It fails on what TestReliability
// fails on, and when the consumers, after the loss of their node, do not
// consume again within the targets (p50 5 s, max 15 s). The summary has
// each process's reconnect time per node fault and the throughput before,
// during and after it (`make reliability TRANSPORT=cluster`).
func TestReliabilityCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection suite: runs without -short")
	}
	skipPoison(t)
	dsn := testenv.PostgresDSN(t)
	urls := testenv.AMQPClusterURLs(t)
	if len(urls) < 3 {
		t.Fatalf("%s lists %d nodes; the cluster profile needs 3", testenv.AMQPClusterVar, len(urls))
	}
	prof, err := reliability.ProfileFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	cl := &reliability.Cluster{Script: testenv.ClusterScript(t), URLs: urls}
	for n := 1; n <= len(urls); n++ {
		if !cl.Answers(n) {
			t.Logf("node %d is down: starting it", n)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			_, err := cl.Run(ctx, "start-node", strconv.Itoa(n))
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	runProfile(t, reliability.ForCluster(prof), reliability.Env{
		PostgresDSN: dsn,
		AMQPURL:     strings.Join(urls, ","),
		Broker:      &reliability.Broker{URL: urls[0]},
		Cluster:     cl,
	})
}
