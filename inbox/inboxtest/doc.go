// Package inboxtest is the conformance suite for inbox.Store
// implementations. A store package runs it from its tests:
//
//	func TestInbox(t *testing.T) {
//		inboxtest.Run(t, func(t *testing.T) inbox.Store { return newEmptyStore(t) })
//	}
//
// The suite waits for real lock expiries (a few hundred milliseconds at a
// time), so it takes a few seconds.
package inboxtest
