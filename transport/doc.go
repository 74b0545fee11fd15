// Package transport is the seam between the bus and a message transport:
// the Transport interface the consume engine reads from and the outbox
// relay publishes to, the Factory a transport package hands to
// bus.WithTransport, the optional capabilities a transport may add, and
// the helpers its subscriber needs.
//
// The transports that ship with BareWire implement it in sub-packages:
// transport/inproc (the embedded default), transport/rabbitmq and
// transport/pgtransport. A service imports only the ones it uses, so it
// links only their drivers. Package transporttest is the conformance
// suite every transport runs.
//
// This API may still change between minor versions, as River's
// riverdriver does: it is public so that transports can live outside this
// module, but it is shaped by the bus's needs first. Pin a version when
// you implement it.
package transport
