// Package saga coordinates long-running processes as state machines whose
// transitions happen exactly once.
//
// A machine is defined over the user's own GORM model, which embeds State
// (correlation id, current state, version). Events are message types,
// each with a function that finds the instance a message belongs to;
// behaviors say what an event does in a state:
//
//	m, err := saga.New("order-flow", func(m *saga.Machine[Order]) {
//		awaiting := m.State("AwaitingPayment")
//		submitted := saga.NewEvent(m, func(e OrderSubmitted) string { return e.OrderID })
//		paid := saga.NewEvent(m, func(e PaymentCompleted) string { return e.OrderID })
//		m.Initially(saga.When(submitted).Publish(requestPayment).TransitionTo(awaiting))
//		m.During(awaiting, saga.When(paid).Finalize())
//	})
//
// Register puts the machine on a receive endpoint. Each event is applied
// in the consumer's transaction (bus.TxFromContext): the instance is
// loaded, the behavior's steps run, the instance is saved, and all of it
// commits with the inbox's processed mark and the outbox rows of whatever
// the steps published. A redelivered or re-published event (same message
// id) never moves an instance twice, and a transition's messages leave
// only if it commits.
//
// Concurrency: by default optimistic. The update is conditional on the
// version read; when another transaction changed the instance first, the
// attempt is rolled back to a savepoint (its writes and outbox rows go),
// the instance is read again and the event re-applied, up to
// MaxConflictRetries times, then the event fails with
// ErrConcurrencyConflict and the endpoint's retry policy takes over.
// Pessimistic locks the row with SELECT ... FOR UPDATE instead.
//
// Finalized instances are deleted at once, kept (KeepFinalized), or kept
// for a period (RetainFinalized) after which RunCleanup deletes them.
//
// Instance data is the model's own columns, or documents in JSON columns
// (JSON[T]). Operators list instances with List, CountByState and Get, the
// admin API (admin.Sagas) or the barewire command (barewire saga).
//
// Timeouts: NewSchedule declares an event as a timeout kept in a token
// field of the instance; a behavior's Schedule sends it back to the
// machine's endpoint with bus.Delay through the outbox in the transition's
// transaction, Unschedule cancels it, and a transition that moves the
// instance to another state cancels the timeouts it did not schedule. A
// timeout whose message id is not the token is ignored on arrival.
//
// Respond answers a request (bus.Request) from a transition, through the
// outbox. See docs/sagas.md.
//
// Not yet: a hold policy for unhandled events.
package saga
