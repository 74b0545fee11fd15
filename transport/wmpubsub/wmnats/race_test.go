//go:build race

package wmnats_test

// raceEnabled: watermill-nats v2.1.3 closes a subscription's output
// channel right after it unsubscribes, while a NATS callback that began
// before may still send on it (subscriber.go: close(output) against
// processMessage's send), which the race detector reports in tests that
// end subscriptions with messages in flight.
const raceEnabled = true
