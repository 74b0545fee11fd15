package reliability

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Broker drives the RabbitMQ broker for the faults and the final counts:
// rabbitmqctl for closing one process's connections, a plain AMQP
// connection for queue depths and cleanup.
type Broker struct {
	// URL is the AMQP URL of the broker.
	URL string
	// Ctl is the rabbitmqctl command (with any arguments such as -n node);
	// empty disables the faults that need it.
	Ctl []string
}

// ErrNoCtl is returned by operations that need rabbitmqctl when it is not
// configured.
var ErrNoCtl = errors.New("reliability: rabbitmqctl is not available (set BAREWIRE_TEST_RABBITMQCTL or put rabbitmqctl on PATH)")

// connNameRE finds the OS pid in the connection name the transport gives
// its connections ("barewire <host> pid <pid>", transport/rabbitmq).
var connNameRE = regexp.MustCompile(`\{"connection_name","[^"]* pid (\d+)"\}`)

func (b *Broker) ctl(ctx context.Context, args ...string) ([]byte, error) {
	if len(b.Ctl) == 0 {
		return nil, ErrNoCtl
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Ctl[0], append(append([]string{}, b.Ctl[1:]...), args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Connections returns the broker-side ids of the connections opened by the
// OS process pid. Only connections named by the bus's transport are found,
// so no other client of the broker is ever touched.
func (b *Broker) Connections(ctx context.Context, pid int) ([]string, error) {
	out, err := b.ctl(ctx, "list_connections", "-q", "--no-table-headers", "pid", "client_properties")
	if err != nil {
		return nil, err
	}
	var ids []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		connPid, props, ok := strings.Cut(sc.Text(), "\t")
		if !ok {
			continue
		}
		m := connNameRE.FindStringSubmatch(props)
		if m != nil && m[1] == strconv.Itoa(pid) {
			ids = append(ids, strings.TrimSpace(connPid))
		}
	}
	return ids, sc.Err()
}

// CloseConnections makes the broker close every connection of OS process
// pid, as a broker restart or a network cut would, and returns how many it
// closed.
func (b *Broker) CloseConnections(ctx context.Context, pid int, reason string) (int, error) {
	ids, err := b.Connections(ctx, pid)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, id := range ids {
		if _, err := b.ctl(ctx, "close_connection", id, reason); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// QueueDepths returns, for each named queue that exists, its message count
// including unacknowledged messages (rabbitmqctl), or only ready messages
// (AMQP passive declare) when rabbitmqctl is not available.
func (b *Broker) QueueDepths(ctx context.Context, queues []string) (map[string]int, error) {
	want := map[string]bool{}
	for _, q := range queues {
		want[q] = true
	}
	depths := map[string]int{}
	if len(b.Ctl) > 0 {
		out, err := b.ctl(ctx, "list_queues", "-q", "--no-table-headers", "name", "messages")
		if err != nil {
			return nil, err
		}
		for line := range strings.SplitSeq(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && want[f[0]] {
				n, _ := strconv.Atoi(f[1])
				depths[f[0]] = n
			}
		}
		return depths, nil
	}
	return b.readyCounts(queues)
}

// readyCounts returns the ready message count of each existing queue.
func (b *Broker) readyCounts(queues []string) (map[string]int, error) {
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	depths := map[string]int{}
	for _, q := range queues {
		ch, err := conn.Channel()
		if err != nil {
			return nil, err
		}
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err == nil {
			depths[q] = st.Messages
			_ = ch.Close()
		}
	}
	return depths, nil
}

// DeleteTopology deletes queues (and their error queues) and exchanges.
func (b *Broker) DeleteTopology(queues, exchanges []string) error {
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	var errs []error
	for _, q := range queues {
		for _, name := range []string{q, q + "_error"} {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				errs = append(errs, err)
				if ch, err = conn.Channel(); err != nil {
					return errors.Join(append(errs, err)...)
				}
			}
		}
	}
	for _, x := range exchanges {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			errs = append(errs, err)
			if ch, err = conn.Channel(); err != nil {
				return errors.Join(append(errs, err)...)
			}
		}
	}
	return errors.Join(errs...)
}
