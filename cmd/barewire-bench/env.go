package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// env is one run's share of the services: a unique suffix for every table,
// queue and exchange it creates, and the list of what to remove at the end.
type env struct {
	dsn, url string
	// cluster lists a RabbitMQ cluster's node URLs, comma-separated (the
	// e2e-cluster scenario); empty without one.
	cluster string
	suffix  string
	keep    bool

	mu     sync.Mutex
	tables []string
	queues []string
	exchs  []string
	// cqueues and cexchs live on the cluster.
	cqueues []string
	cexchs  []string
}

func newEnv(dsn, url, cluster string, keep bool) *env {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &env{dsn: dsn, url: url, cluster: cluster, suffix: hex.EncodeToString(b), keep: keep}
}

func (e *env) addClusterTopology(queues, exchanges []string) {
	e.mu.Lock()
	e.cqueues = append(e.cqueues, queues...)
	e.cexchs = append(e.cexchs, exchanges...)
	e.mu.Unlock()
}

// clusterNode returns the URL of the first cluster node that accepts a
// connection, with the connection.
func (e *env) clusterNode() (string, *amqp.Connection, error) {
	var errs []error
	for _, u := range strings.Split(e.cluster, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue
		}
		conn, err := amqp.Dial(u)
		if err == nil {
			return u, conn, nil
		}
		errs = append(errs, err)
	}
	return "", nil, fmt.Errorf("no cluster node answers: %w", joinErrs(errs...))
}

// name returns a unique identifier-safe name for kind, remembered for
// cleanup as a table, queue or exchange according to what.
func (e *env) name(kind string) string {
	return "bwb_" + e.suffix + "_" + kind
}

func (e *env) addTables(names ...string) {
	e.mu.Lock()
	e.tables = append(e.tables, names...)
	e.mu.Unlock()
}

func (e *env) addQueues(names ...string) {
	e.mu.Lock()
	e.queues = append(e.queues, names...)
	e.mu.Unlock()
}

func (e *env) addExchanges(names ...string) {
	e.mu.Lock()
	e.exchs = append(e.exchs, names...)
	e.mu.Unlock()
}

// cleanup drops every table and deletes every queue and exchange recorded
// so far, and forgets them.
func (e *env) cleanup(ctx context.Context) error {
	e.mu.Lock()
	tables, queues, exchs := e.tables, e.queues, e.exchs
	cqueues, cexchs := e.cqueues, e.cexchs
	e.tables, e.queues, e.exchs, e.cqueues, e.cexchs = nil, nil, nil, nil, nil
	e.mu.Unlock()
	if e.keep {
		return nil
	}
	var errs []error
	if len(cqueues)+len(cexchs) > 0 {
		if _, conn, err := e.clusterNode(); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, deleteTopology(conn, cqueues, cexchs)...)
			_ = conn.Close()
		}
	}
	if len(tables) > 0 {
		pool, err := pgxpool.New(ctx, e.dsn)
		if err != nil {
			errs = append(errs, err)
		} else {
			for _, t := range tables {
				if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+quoteIdent(t)+` CASCADE`); err != nil {
					errs = append(errs, fmt.Errorf("drop %s: %w", t, err))
				}
			}
			pool.Close()
		}
	}
	if len(queues)+len(exchs) > 0 {
		conn, err := amqp.Dial(e.url)
		if err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, deleteTopology(conn, queues, exchs)...)
			_ = conn.Close()
		}
	}
	return joinErrs(errs...)
}

// deleteTopology deletes queues and exchanges on conn.
func deleteTopology(conn *amqp.Connection, queues, exchs []string) []error {
	var errs []error
	for _, q := range queues {
		ch, err := conn.Channel()
		if err != nil {
			return append(errs, err)
		}
		_, _ = ch.QueueDelete(q, false, false, false)
		_ = ch.Close()
	}
	for _, x := range exchs {
		ch, err := conn.Channel()
		if err != nil {
			return append(errs, err)
		}
		_ = ch.ExchangeDelete(x, false, false)
		_ = ch.Close()
	}
	return errs
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// businessDDL creates the producer-side and consumer-side business tables:
// the same two tables for every pipeline.
func businessDDL(orders, effects string) []string {
	return []string{
		`CREATE TABLE ` + orders + ` (id bigserial PRIMARY KEY, message_id text NOT NULL, amount integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`,
		`CREATE TABLE ` + effects + ` (id bigserial PRIMARY KEY, message_id text NOT NULL, amount integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`,
	}
}

// declareQueue declares a durable fanout exchange and a durable classic
// queue bound to it, as BareWire's topology builder does for an endpoint.
func declareQueue(conn *amqp.Connection, exchange, queue string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if exchange != "" {
		if err := ch.ExchangeDeclare(exchange, "fanout", true, false, false, false, nil); err != nil {
			return err
		}
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return err
	}
	if exchange != "" {
		return ch.QueueBind(queue, "", exchange, false, nil)
	}
	return nil
}

// queueDepth returns the number of ready messages in queue.
func queueDepth(conn *amqp.Connection, queue string) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}
