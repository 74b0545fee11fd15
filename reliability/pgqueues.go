package reliability

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/reliability/workload"
)

// queueOps is what the harness needs from a transport's queues: depths for
// the drain and the final counts, and cleanup. *Broker implements it for
// RabbitMQ, pgQueues for the PostgreSQL transport.
type queueOps interface {
	QueueDepths(ctx context.Context, queues []string) (map[string]int, error)
	DeleteTopology(queues, exchanges []string) error
}

var (
	_ queueOps = (*Broker)(nil)
	_ queueOps = (*pgQueues)(nil)
)

// pgQueues reads the PostgreSQL transport's queue table of a run.
type pgQueues struct {
	db    *gorm.DB
	names workload.Names
}

// QueueDepths counts each named queue's rows, claimed (leased) or not:
// like RabbitMQ's count with unacknowledged messages. A queue with no row
// is reported as 0 when it is declared, and left out when it is not.
func (q *pgQueues) QueueDepths(ctx context.Context, queues []string) (map[string]int, error) {
	if err := q.names.Validate(); err != nil {
		return nil, err
	}
	messagesT, queuesT := q.names.TransportTables()[0], q.names.TransportTables()[1]
	var rows []struct {
		Name string
		N    int
	}
	err := q.db.WithContext(ctx).Raw(`SELECT d.name, (SELECT count(*) FROM `+messagesT+` m WHERE m.queue = d.name) AS n
FROM `+queuesT+` d WHERE d.name IN ?`, queues).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("reliability: queue depths: %w", err)
	}
	depths := make(map[string]int, len(rows))
	for _, r := range rows {
		depths[r.Name] = r.N
	}
	return depths, nil
}

// DeleteTopology drops the transport's tables of the run: on this
// transport the run's queues and bindings live in them alone.
func (q *pgQueues) DeleteTopology(_, _ []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return workload.DropTransport(ctx, q.db, q.names)
}

// terminateSessions terminates every database session whose
// application_name is appName (one service process's: see
// workload.ApplicationName) and returns how many it terminated.
func terminateSessions(ctx context.Context, db *gorm.DB, appName string) (int, error) {
	var n int
	err := db.WithContext(ctx).Raw(`SELECT count(*) FROM (
    SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = ? AND pid <> pg_backend_pid()) t
WHERE ok`, appName).Scan(&n).Error
	return n, err
}
