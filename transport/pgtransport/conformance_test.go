package pgtransport_test

import (
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/pgtransport"
	"github.com/barewire-go/barewire/transport/transporttest"
)

// TestConformance runs the seam's conformance suite against the real
// database. Its "connection" is the pool's sessions: Reconnect terminates
// every session of the transport's pool on the server
// (pg_terminate_backend, found by a unique application_name), including
// the one LISTENing. The lease is short so that the message in flight at
// Close is delivered again to the next instance within the suite's
// timeout.
func TestConformance(t *testing.T) {
	e := newEnv(t)
	app := "conformance_" + e.prefix
	dsn := testenv.PostgresDSN(t)
	if strings.Contains(dsn, "://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + "application_name=" + app
	} else {
		dsn += " application_name=" + app
	}
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	transporttest.Run(t, transporttest.Config{
		New: func(t *testing.T, declare func(*endpoint.Endpoints)) transport.Factory {
			return pgtransport.New(db, func(c *pgtransport.Config) {
				c.TablePrefix = e.prefix
				c.Lease = time.Second
				c.PollInterval = 100 * time.Millisecond
				declare(&c.Endpoints)
			})
		},
		Durable:        true,
		NackGoesBehind: true,
		Reconnect: func(t *testing.T, _ transport.Transport) {
			var n int
			if err := e.db.Raw(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = ?`, app).Scan(&n).Error; err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Fatal("no session of the transport's pool to terminate")
			}
			t.Logf("terminated %d sessions", n)
		},
	})
}
