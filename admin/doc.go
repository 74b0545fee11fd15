// Package admin serves an HTTP API for operators of a bus: its endpoints,
// counters, inbox entries and outbox rows, JSON everywhere, and, when
// enabled, the two repairs an operator needs: re-queuing parked outbox rows
// and dropping a stuck inbox lock.
//
//	mux.Handle("/admin/", http.StripPrefix("/admin", admin.Handler(b)))                      // read-only
//	mux.Handle("/ops/", http.StripPrefix("/ops", admin.Handler(b, admin.AllowActions()))) // with actions
//
// Read-only routes, relative to where the handler is mounted:
//
//	GET  /            the route list
//	GET  /endpoints   endpoints: consumers and message types, prefetch, concurrency, retry policy, inbox mode
//	GET  /stats       bus counters, outbox and inbox counts
//	GET  /inbox       inbox entries, newest first; ?messageId= &consumerType= &processed=true|false &limit= &offset=
//	GET  /outbox      outbox rows, oldest first; ?status=pending|parked|delivered &afterId= &limit=
//	GET  /outbox/{id} one outbox row
//	GET  /sagas       the machines given to Sagas, with their instance counts by state
//	GET  /sagas/{name}       instances, least recently changed first; ?state= &limit=
//	GET  /sagas/{name}/{id}  one instance by correlation id
//
// Actions, only with AllowActions (bodies are JSON, sent with
// Content-Type: application/json, which a cross-site form cannot send):
//
//	POST /outbox/requeue  {"ids":[1,2]} or {"allParked":true}: parked rows back to pending
//	POST /inbox/release   {"messageId":"…","consumerType":"…"}: drop a stuck inbox lock
//
// Payloads are never shown (only their size); saga instances are shown
// with their data (see Sagas). The handler does no
// authentication: put it behind the application's own. It reads the bus
// through its public methods (Endpoints, Stats, InboxStore, OutboxStore);
// the queries it runs are the stores' own (gormstore), including
// gormstore.Inbox.ForceRelease behind inbox/release.
package admin
