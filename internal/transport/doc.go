// Package transport defines what the bus needs from a message transport
// (in-process, RabbitMQ, PostgreSQL). Implementations live in sibling
// internal packages; the bus wires them into the Watermill router.
package transport
