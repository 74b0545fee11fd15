package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

var queueName = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// SuspendRabbitQueue suspends the Erlang process of classic queue name on
// the machine's RabbitMQ (vhost "/", through rabbitmqctl): publishes routed
// to it are never confirmed, while every other queue works. The test's
// cleanup resumes it. This is a destination that stops answering (as a
// quorum queue without a majority does), on one node.
func SuspendRabbitQueue(t testing.TB, name string) {
	t.Helper()
	if !queueName.MatchString(name) {
		t.Fatalf("SuspendRabbitQueue: queue name %q: letters, digits, '.', '_' and '-' only", name)
	}
	pid := fmt.Sprintf(`begin {ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"%s">>)), amqqueue:get_pid(Q) end`, name)
	rabbitEval(t, "sys:suspend("+pid+").")
	t.Cleanup(func() { rabbitEval(t, "sys:resume("+pid+").") })
}

func rabbitEval(t testing.TB, expr string) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Fatalf("rabbitmqctl not found (needed to suspend a queue): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "eval", expr).CombinedOutput()
	if err != nil || strings.Contains(string(out), "error") {
		t.Fatalf("rabbitmqctl eval %s: %v\n%s", expr, err, out)
	}
}
