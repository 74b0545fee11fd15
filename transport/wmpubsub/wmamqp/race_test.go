//go:build race

package wmamqp_test

// raceEnabled: watermill-amqp v3.0.2 reconnects with an unsynchronized
// write (ConnectionWrapper.handleConnectionClose sets c.connected while
// IsConnected reads it from the publisher and subscribers), which the race
// detector reports in any test that drops the connection.
const raceEnabled = true
