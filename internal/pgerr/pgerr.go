// Package pgerr reads PostgreSQL errors without linking a driver: the
// packages that every service imports (bus, gormstore) must not pull in
// pgx or lib/pq for a service on the embedded SQLite default. Both drivers'
// error types carry the SQLSTATE behind a SQLState method.
package pgerr

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"reflect"
	"strings"
)

// SQLState returns the SQLSTATE of the first error in err's chain that
// carries one (pgx's *pgconn.PgError, lib/pq's *pq.Error), or "".
func SQLState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// IsConnectError reports whether err's chain holds pgx's
// *pgconn.ConnectError: a connection attempt that failed, whatever its
// cause (refused, TLS, authentication, server starting up). The type is
// matched by name, since importing it would link pgx.
func IsConnectError(err error) bool {
	for _, e := range chain(err) {
		if t := reflect.TypeOf(e); t != nil && t.String() == "*pgconn.ConnectError" {
			return true
		}
	}
	return false
}

// commitRollback is the text of pgx's ErrTxCommitRollback.
const commitRollback = "commit unexpectedly resulted in rollback"

// IsCommitRollback reports whether err's chain holds pgx's
// ErrTxCommitRollback: COMMIT answered ROLLBACK because the transaction
// had been aborted by an earlier failed statement.
func IsCommitRollback(err error) bool {
	for _, e := range chain(err) {
		if e.Error() == commitRollback {
			return true
		}
	}
	return false
}

// chain lists err and every error it wraps, depth first.
func chain(err error) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if e == nil || len(out) > 64 {
			return
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}

// ConnectionClass reports whether err says the connection to the server
// failed rather than the statement: database/sql's bad or closed
// connection, SQLSTATE class 08 (connection exception) or 57P01-03 (the
// server is shutting down, crashed, or not accepting connections yet), a
// failed connection attempt, or a network error. Apply it only to the
// framework's own statements: a consumer's network error is the
// consumer's.
func ConnectionClass(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return true
	}
	if code := SQLState(err); code != "" {
		return strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03"
	}
	var ne net.Error
	return IsConnectError(err) || errors.As(err, &ne)
}
