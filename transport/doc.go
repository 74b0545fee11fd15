// Package transport is the seam between the bus and a message transport:
// the Transport interface the consume engine reads from and the outbox
// relay publishes to, the Factory a transport package hands to
// bus.WithTransport, the optional capabilities a transport may add, and
// the helpers its subscriber needs.
//
// The transports that ship with BareWire implement it in sub-packages:
// transport/inproc (the embedded default), transport/rabbitmq and
// transport/pgtransport. A service imports only the ones it uses, so it
// links only their drivers. Package transport/transporttest is the
// conformance suite every transport runs.
//
// This API may still change between minor versions, as River's
// riverdriver does: it is public so that transports can live outside this
// module, but it is shaped by the bus's needs first. Pin a version when
// you implement it.
//
// # Writing a transport
//
// A transport package exports a New that takes its own settings and a
// configure func(*Config), where Config embeds endpoint.Endpoints, and
// returns a value implementing Factory. bus.New calls Factory.Endpoints for
// the declared receive endpoints, then Factory.Build with an Env (the bus's
// logger, the relay's lease, a commit callback); Build validates and does no
// I/O, and bus.New wraps its error in bus.ErrInvalidOption. Transport.Start
// connects and declares what the endpoints need. A transport without queue
// arguments or exchange-to-exchange routing refuses the settings it cannot
// honour with CheckPlainEndpoints.
//
// The optional interfaces say what else a transport can do, and the bus
// type-asserts for them: Named (the messaging.system of telemetry),
// MandatoryDeliverer (fail a publish no queue receives, with ErrUnroutable),
// TxDeliverer (write in the caller's database transaction, or refuse with
// ErrTxUnsupported), TxAcker (acknowledge in the consumer's transaction) and
// ConnDropper (lose the connection on demand, for fault injection; a
// transport without it makes bus.DropConnection return ErrDropUnsupported)
// and KeyPartitioner (route ordering keys to an ordered endpoint's partition
// queues; without it bus.Start refuses ordered endpoints).
package transport
