// Package outboxtest is the conformance suite for outbox.Store
// implementations. A store package runs it from its tests, giving a fresh
// store and a way to run a transaction the store's Add can see:
//
//	func TestOutbox(t *testing.T) {
//		outboxtest.Run(t, func(t *testing.T) (outbox.Store, outboxtest.InTx) {
//			db := openEmptyDatabase(t)
//			inTx := func(ctx context.Context, fn func(ctx context.Context) error) error {
//				return db.Transaction(ctx, func(tx *Tx) error { return fn(withTx(ctx, tx)) })
//			}
//			return newStore(db), inTx
//		})
//	}
//
// The suite waits for real leases to expire (a few hundred milliseconds at a
// time), so it takes a few seconds.
package outboxtest
