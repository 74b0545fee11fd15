package gormstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"
)

// Listen implements outbox.Notifier. On PostgreSQL it holds one connection
// from the pool, LISTENs on the "<prefix>outbox" channel and calls wake for
// every notification: after the commit of any transaction that added outbox
// rows, from any process (each process's commit watcher sends one
// notification for all the commits it saw in one check, see Add). Commits of
// this Outbox's own transactions call wake directly, without the round trip
// through PostgreSQL, for as long as Listen runs. Listen returns nil when ctx
// is done, and an error when the connection fails; the caller decides
// whether to listen again (relays also poll, so a gap only delays delivery).
// The connection is discarded, not returned to the pool, so no LISTEN
// outlives the call.
//
// wake runs on the listening or the watching goroutine and should not
// block: a non-blocking send on a buffered channel of one is the usual
// shape, since one wake-up covers any number of commits.
//
// On SQLite there is nothing to listen to (one process owns the database
// and wakes its relay in process): Listen waits for ctx and returns nil.
//
// Listen needs the pgx driver that gorm.io/driver/postgres uses by default.
func (o *Outbox) Listen(ctx context.Context, wake func()) error {
	if o.s.dialect.name != DialectPostgres {
		<-ctx.Done()
		return nil
	}
	defer o.watch.addWaker(wake)()
	sqlDB, err := o.s.db.DB()
	if err != nil {
		return fmt.Errorf("gormstore: listen: %w", err)
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("gormstore: listen: %w", err)
	}
	defer conn.Close()

	var loopErr error
	_ = conn.Raw(func(dc any) error {
		loopErr = o.listen(ctx, dc, wake)
		// Whatever happened, the session is not fit for the pool any more:
		// it is subscribed to the channel, or its wait was cut short by the
		// cancelled context. ErrBadConn makes database/sql close it.
		return driver.ErrBadConn
	})
	if ctx.Err() != nil {
		return nil
	}
	return loopErr
}

func (o *Outbox) listen(ctx context.Context, dc any, wake func()) error {
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		return fmt.Errorf("gormstore: listen: need the pgx stdlib driver, have %T", dc)
	}
	pc := sc.Conn()
	// Quoted so that the channel name keeps its case and matches the string
	// that pg_notify is given in Add.
	if _, err := pc.Exec(ctx, `LISTEN "`+o.channel+`"`); err != nil {
		return fmt.Errorf("gormstore: listen: %w", err)
	}
	for {
		n, err := pc.WaitForNotification(ctx)
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("gormstore: listen: %w", err)
		}
		if n.Payload == o.watch.token {
			continue // our own watcher's: it already called wake
		}
		wake()
	}
}
