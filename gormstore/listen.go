package gormstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
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
// It drives pgx's connection through its exported methods (Conn, Exec,
// WaitForNotification) by reflection, so that gormstore links no
// PostgreSQL driver for services on SQLite; with another driver it returns
// an error at once, and relays fall back to polling.
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
	pc, err := pgxConn(dc)
	if err != nil {
		return err
	}
	// Quoted so that the channel name keeps its case and matches the string
	// that pg_notify is given in Add.
	if err := pc.exec(ctx, `LISTEN "`+o.channel+`"`); err != nil {
		return fmt.Errorf("gormstore: listen: %w", err)
	}
	for {
		payload, err := pc.wait(ctx)
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("gormstore: listen: %w", err)
		}
		if payload == o.watch.token {
			continue // our own watcher's: it already called wake
		}
		wake()
	}
}

// reflectedConn is a *pgx.Conn reached through database/sql's driver
// connection (pgx's *stdlib.Conn) without importing pgx.
type reflectedConn struct {
	execM, waitM reflect.Value
}

var (
	ctxType   = reflect.TypeFor[context.Context]()
	errorType = reflect.TypeFor[error]()
)

// pgxConn checks that dc is pgx's stdlib connection and binds the two
// methods Listen needs, with their signatures checked.
func pgxConn(dc any) (*reflectedConn, error) {
	bad := fmt.Errorf("gormstore: listen: need the pgx stdlib driver (gorm.io/driver/postgres's default), have %T", dc)
	v := reflect.ValueOf(dc)
	if !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, bad
	}
	connM := v.MethodByName("Conn")
	if !connM.IsValid() || connM.Type().NumIn() != 0 || connM.Type().NumOut() != 1 {
		return nil, bad
	}
	pc := connM.Call(nil)[0]
	if pc.Kind() != reflect.Pointer || pc.IsNil() || pc.Type().String() != "*pgx.Conn" {
		return nil, bad
	}
	c := &reflectedConn{execM: pc.MethodByName("Exec"), waitM: pc.MethodByName("WaitForNotification")}
	et, wt := c.execM.Type(), c.waitM.Type()
	if !c.execM.IsValid() || !c.waitM.IsValid() ||
		et.NumIn() != 3 || et.In(0) != ctxType || et.In(1).Kind() != reflect.String || !et.IsVariadic() ||
		et.NumOut() != 2 || et.Out(1) != errorType ||
		wt.NumIn() != 1 || wt.In(0) != ctxType || wt.NumOut() != 2 || wt.Out(1) != errorType ||
		wt.Out(0).Kind() != reflect.Pointer || wt.Out(0).Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("gormstore: listen: pgx's Conn has an unexpected API (%v, %v)", et, wt)
	}
	if f, ok := wt.Out(0).Elem().FieldByName("Payload"); !ok || f.Type.Kind() != reflect.String {
		return nil, fmt.Errorf("gormstore: listen: pgx's Notification has no Payload string")
	}
	return c, nil
}

func (c *reflectedConn) exec(ctx context.Context, sql string) error {
	out := c.execM.Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(sql)})
	return asError(out[1])
}

// wait is pgx's WaitForNotification, returning the payload.
func (c *reflectedConn) wait(ctx context.Context) (string, error) {
	out := c.waitM.Call([]reflect.Value{reflect.ValueOf(ctx)})
	if err := asError(out[1]); err != nil {
		return "", err
	}
	if out[0].IsNil() {
		return "", nil
	}
	return out[0].Elem().FieldByName("Payload").String(), nil
}

func asError(v reflect.Value) error {
	if v.IsNil() {
		return nil
	}
	return v.Interface().(error)
}
