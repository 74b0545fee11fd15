package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/inproc"
)

// Errors returned by the bus.
var (
	// ErrNotStarted is returned by calls that need a started bus.
	ErrNotStarted = errors.New("bus: not started; call Start or Run first")
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("bus: already started")
	// ErrStopped is returned by Start after Stop: a bus runs once.
	ErrStopped = errors.New("bus: stopped; create a new bus with New")
	// ErrStopping is returned by a Request made while Stop drains the
	// endpoints: its answer would come to a bus that is going away.
	// Publish and Send still reach the transport then.
	ErrStopping = errors.New("bus: stopping; no new requests")
	// ErrMessageTooLarge is returned for a body over the maximum message size.
	ErrMessageTooLarge = errors.New("bus: message too large")
	// ErrInvalidMessage is returned for a message the bus cannot publish.
	ErrInvalidMessage = errors.New("bus: invalid message")
)

// Headers are message headers. See the Header* constants for the ones the
// bus interprets.
type Headers = endpoint.Headers

// Header names the bus interprets.
const (
	HeaderMessageID       = wire.HeaderMessageID
	HeaderCorrelationID   = wire.HeaderCorrelationID
	HeaderMessageType     = wire.HeaderMessageType
	HeaderExchange        = wire.HeaderExchange
	HeaderRoutingKey      = wire.HeaderRoutingKey
	HeaderContentType     = wire.HeaderContentType
	HeaderFaultReason     = wire.HeaderFaultReason
	HeaderFaultType       = wire.HeaderFaultType
	HeaderFaultStack      = wire.HeaderFaultStack
	HeaderFaultEndpoint   = wire.HeaderFaultEndpoint
	HeaderFaultAttempts   = wire.HeaderFaultAttempts
	HeaderFaultTime       = wire.HeaderFaultTime
	HeaderFaultExchange   = wire.HeaderFaultExchange
	HeaderFaultRoutingKey = wire.HeaderFaultRoutingKey
	// HeaderFaultMessageID holds, quoted, the original id of a message
	// dead-lettered because its id cannot be stored (NUL byte, invalid
	// UTF-8, over 1024 bytes); the dead letter has a stand-in id.
	HeaderFaultMessageID = wire.HeaderFaultMessageID
	// HeaderFaultUnroutable says why a dead letter is in the error queue
	// rather than in the endpoint's DeadLetterExchange (it routed nowhere).
	HeaderFaultUnroutable = wire.HeaderFaultUnroutable
	// HeaderFaultHeadersDropped is on a dead letter the transport refused
	// with the received message's headers (headers that no longer fit a
	// frame once the fault headers are added, say): it was sent without
	// them, and this says how many were dropped and the transport's error.
	HeaderFaultHeadersDropped = wire.HeaderFaultHeadersDropped
	// HeaderRedeliveryCount counts delayed redeliveries (Endpoint.Redelivery).
	HeaderRedeliveryCount = wire.HeaderRedeliveryCount
	// HeaderDestination is where a received message was sent
	// ("exchange:<name>" or "queue:<name>").
	HeaderDestination = wire.HeaderDestination
	// HeaderResponseAddress is set on a request (Request): where its
	// response goes. Delivery.Respond reads it.
	HeaderResponseAddress = wire.HeaderResponseAddress
	// HeaderRequestID is set on a response: the message id of the request
	// it answers.
	HeaderRequestID = wire.HeaderRequestID
	// HeaderRedelivered is "true" when the transport delivered the message before.
	HeaderRedelivered = transport.MetaRedelivered
	// HeaderDeliveryCount is the broker's delivery count, when it keeps one.
	HeaderDeliveryCount = transport.MetaDeliveryCount
)

// Bus is a message bus: receive endpoints consuming from a transport, an
// outbox relaying what transactions publish, and an inbox deduplicating
// what consumers receive. Create it with New, then Start/Stop or Run.
type Bus struct {
	cfg       config
	log       *slog.Logger
	endpoints []*endpoint.Endpoint
	tr        transport.Transport
	mem       *inproc.Transport // tr, when it is the in-process transport
	system    string            // the transport's messaging.system

	db       *gorm.DB
	ownDB    bool
	store    *gormstore.Store
	inboxSt  inbox.Store
	outboxSt outbox.Store
	relay    *outbox.Relay
	router   *message.Router
	// wakeRelay is relay for wake, which consumers call while Stop holds mu.
	wakeRelay atomic.Pointer[outbox.Relay]

	// life serializes Start and Stop's state changes (a one-slot
	// semaphore, so that Stop can give up waiting for a Start at its
	// deadline). Stop does not hold it while it drains: handlers call the
	// bus then (Publish, Request), and read state without it.
	life       chan struct{}
	state      atomic.Int32  // stateNew, stateStarted, stateStopping, stateStopped
	stopped    chan struct{} // closed when Stop has finished
	cancel     context.CancelFunc
	bg         sync.WaitGroup
	routerDone chan error
	ctr        counters   // Stats (stats.go)
	tel        *telemetry // OpenTelemetry (telemetry.go)
	obs        fanout     // what the engine reports goes to every observer (observe.go)
	gate       *dbGate
	replies    replies // the reply queue and the requests waiting (request.go)
	// batchers are the group-commit workers by endpoint (batch.go);
	// batchHook and submitHook, set by tests before Start, see every
	// batch and every attempt handed to the workers.
	batchers   map[string]*batcher
	batchHook  func(endpoint string, ids []string)
	submitHook func(id string)
}

// The lifecycle of a bus (Bus.state).
const (
	stateNew int32 = iota
	stateStarted
	stateStopping // Stop is draining
	stateStopped
)

// stopGrace is how long Stop waits past its deadline for the relay and
// the cleanup loops it has just canceled.
const stopGrace = time.Second

// running returns nil when the bus is started or draining (its transport
// and database are open), else ErrNotStarted.
func (b *Bus) running() error {
	switch b.state.Load() {
	case stateStarted, stateStopping:
		return nil
	}
	return ErrNotStarted
}

// New builds a bus from options. It performs no I/O: connections are made
// and tables created by Start. With no options it runs on the embedded
// default (in-memory SQLite and the in-process transport). Every
// configuration mistake is reported, joined into one error.
func New(opts ...Option) (*Bus, error) {
	c := config{}
	var errs []error
	for _, o := range opts {
		if o == nil {
			errs = append(errs, optErr("nil option"))
			continue
		}
		if err := o(&c); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.errs...)
	c.outboxOpts.Defaults()
	for _, err := range c.outboxOpts.Validate() {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidOption, err))
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.serializer == nil {
		c.serializer = endpoint.JSON
	}
	if c.stopTimeout == 0 {
		c.stopTimeout = 30 * time.Second
	}
	if c.maxMessageSize == 0 {
		c.maxMessageSize = 16 << 20
	}
	if c.instanceID == "" {
		host, _ := os.Hostname()
		c.instanceID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), wire.NewID()[:8])
	}
	if c.db != nil && c.sqlitePath != "" {
		errs = append(errs, optErr("WithSQLite and WithDatabase both choose a database; keep one"))
	}

	f := c.factory
	if f == nil {
		f = inproc.New(nil)
	}
	system := "unknown"
	if n, ok := f.(transport.Named); ok {
		system = n.System()
	}
	b := &Bus{cfg: c, log: c.logger, system: system, life: make(chan struct{}, 1)}
	b.tel = newTelemetry(c.telemetry, system)
	b.obs = newFanout(b.tel, &b.ctr, c.telemetry.observers)
	b.gate = newDBGate(b, b.log)
	eps := f.Endpoints()
	if eps == nil {
		eps = &endpoint.Endpoints{}
	}
	for _, err := range eps.Errs() {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidOption, err))
	}
	seen := map[string]bool{}
	for _, ep := range eps.List() {
		if seen[ep.Name()] {
			errs = append(errs, fmt.Errorf("%w: endpoint %q is declared twice; merge its consumers into one ReceiveEndpoint call", ErrInvalidOption, ep.Name()))
			continue
		}
		seen[ep.Name()] = true
		b.endpoints = append(b.endpoints, ep)
	}
	tr, err := f.Build(transport.Env{
		Logger:     c.logger,
		RelayLease: c.outboxOpts.RelayLease,
		// Messages a transport wrote in the caller's transaction count
		// as published once it sees that transaction commit.
		OnCommitted: func(msgs []*outbox.Message) { b.obs.delivered(msgs, false) },
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("%w: %s transport: %w", ErrInvalidOption, system, err))
	} else {
		b.tr = tr
		b.mem, _ = tr.(*inproc.Transport)
	}
	if d, ok := f.(interface{ Database() *gorm.DB }); ok && c.db == nil && c.sqlitePath == "" {
		// The PostgreSQL transport: keep the inbox and outbox in its
		// database, so that a message published in a transaction on it
		// is written straight to its queues in that transaction.
		c.db = d.Database()
	}

	if c.db != nil {
		store, err := gormstore.New(c.db, b.storeOptions()...)
		if c.clock != nil && c.db.Dialector != nil && c.db.Dialector.Name() != gormstore.DialectSQLite {
			errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidOption, ErrClockUnsupported))
		} else if err != nil {
			errs = append(errs, fmt.Errorf("%w: WithDatabase: %w", ErrInvalidOption, err))
		} else {
			b.useStore(c.db, store)
		}
	} else if err := gormstore.ValidatePrefix(c.outboxOpts.TablePrefix); err != nil {
		errs = append(errs, fmt.Errorf("%w: TablePrefix: %w", ErrInvalidOption, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return b, nil
}

// storeOptions are the gormstore options of the bus's store.
func (b *Bus) storeOptions() []gormstore.Option {
	opts := []gormstore.Option{gormstore.WithTablePrefix(b.cfg.outboxOpts.TablePrefix)}
	if b.cfg.clock != nil {
		opts = append(opts, gormstore.WithClock(b.cfg.clock.Now))
	}
	return opts
}

func (b *Bus) useStore(db *gorm.DB, s *gormstore.Store) {
	b.db = db
	b.store = s
	b.inboxSt = s.Inbox()
	b.outboxSt = s.Outbox()
}

// Endpoints returns the receive endpoints, in declaration order.
func (b *Bus) Endpoints() []*endpoint.Endpoint { return b.endpoints }

// DB returns the database holding the inbox and outbox tables (nil before
// Start on the embedded default).
func (b *Bus) DB() *gorm.DB { return b.db }

// InboxStore returns the inbox store, for inspection (nil before Start on
// the embedded default).
func (b *Bus) InboxStore() inbox.Store { return b.inboxSt }

// OutboxStore returns the outbox store, for inspection (nil before Start on
// the embedded default).
func (b *Bus) OutboxStore() outbox.Store { return b.outboxSt }

// Logger returns the bus's logger (WithLogger, else slog.Default()), for
// packages that log on the bus's behalf, such as admin's audit lines.
func (b *Bus) Logger() *slog.Logger { return b.log }

// Start opens the embedded database if none was given, creates the tables
// (with DisableAutoMigrate, checks that they exist), connects the transport, declares the
// topology, and starts the endpoints, the relay and the cleanup loops. ctx
// bounds start-up only.
func (b *Bus) Start(ctx context.Context) (err error) {
	select {
	case b.life <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("bus: Start: another Start or Stop is running: %w", ctx.Err())
	}
	defer func() { <-b.life }()
	switch b.state.Load() {
	case stateStarted:
		return ErrAlreadyStarted
	case stateStopping, stateStopped:
		return ErrStopped
	}
	defer func() {
		if err != nil {
			b.closeResources()
		}
	}()
	if b.db == nil {
		db, err := gormstore.OpenSQLite(b.cfg.sqlitePath)
		if err != nil {
			return fmt.Errorf("bus: open embedded SQLite: %w", err)
		}
		store, err := gormstore.New(db, b.storeOptions()...)
		if err != nil {
			_ = closeDB(db)
			return err
		}
		b.ownDB = true
		b.useStore(db, store)
	}
	if !b.cfg.outboxOpts.DisableAutoMigrate {
		if err := b.store.Migrate(ctx); err != nil {
			return fmt.Errorf("bus: create tables: %w", err)
		}
	} else if err := b.store.CheckSchema(ctx); err != nil {
		return fmt.Errorf("bus: check tables (outbox.Options.DisableAutoMigrate is set, so Start does not create them): %w", err)
	}
	if err := checkOrdering(b.tr, b.endpoints); err != nil {
		return err
	}
	if err := b.tr.Start(ctx, b.endpoints); err != nil {
		return fmt.Errorf("bus: start transport: %w", err)
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: b.cfg.stopTimeout}, watermillLogger(b.log))
	if err != nil {
		return fmt.Errorf("bus: create router: %w", err)
	}
	for _, ep := range b.endpoints {
		h := b.handler(ep)
		for i := 0; i < b.handlersFor(ep); i++ { // batch.go: more deliveries in hand with group commit
			router.AddConsumerHandler(fmt.Sprintf("%s#%d", ep.Name(), i), ep.Name(), b.tr.Subscriber(), h)
		}
		// One handler per partition: the transport hands it one message
		// at a time, so a partition's messages run in queue order (ordering.go).
		for _, q := range ep.PartitionQueues() {
			router.AddConsumerHandler(q, q, b.tr.Subscriber(), h)
		}
	}
	b.router = router

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	b.cancel = cancel
	b.replies.start(runCtx)
	b.startBatchers(runCtx)
	b.routerDone = make(chan error, 1)
	go func() { b.routerDone <- router.Run(runCtx) }()
	if len(b.endpoints) > 0 {
		select {
		case <-router.Running():
		case err := <-b.routerDone:
			cancel()
			return fmt.Errorf("bus: router stopped at start: %w", err)
		case <-ctx.Done():
			cancel()
			_ = router.Close()
			<-b.routerDone
			return ctx.Err()
		}
	}

	o := b.cfg.outboxOpts
	b.relay = &outbox.Relay{
		Store: b.outboxSt, Transport: b.tr, Owner: b.cfg.instanceID,
		PollingInterval: o.PollingInterval, BatchSize: o.DispatchBatchSize, Workers: o.RelayWorkers,
		Lease: o.RelayLease, MaxAttempts: o.MaxAttempts, DeleteOnDeliver: o.DeleteOnDeliver, Logger: b.log,
	}
	if n, ok := b.outboxSt.(outbox.Notifier); ok && b.db.Dialector.Name() == "postgres" {
		b.relay.Notifier = n
	}
	if _, ok := b.tr.(transport.TxDeliverer); ok {
		// The transport writes to a database (the PostgreSQL transport:
		// the store's own): a batch held in an open transaction would keep
		// a pool connection while the delivery waits for another, and with
		// a pool no larger than RelayWorkers every worker would wait
		// forever. Its batches are leased instead.
		b.relay.Store = leasedOnly{b.outboxSt}
	}
	b.relay.Transport = &responseDropper{b: b, next: b.relay.Transport}
	b.instrumentRelay(b.relay)
	b.wakeRelay.Store(b.relay)
	b.bg.Go(func() { b.relay.Run(runCtx) })
	var clk inbox.Clock // a nil interface, not a nil Clock in one
	if b.cfg.clock != nil {
		clk = b.cfg.clock
		// The relay's sleep reads no clock: an advance wakes it, and its
		// next claim sees expired leases and retry delays that have passed.
		b.bg.Go(func() {
			for {
				select {
				case <-runCtx.Done():
					return
				case <-clk.Advanced():
					b.relay.Wake()
				}
			}
		})
	}
	b.bg.Go(func() {
		(&inbox.Cleaner{Store: b.inboxSt, Retention: o.InboxRetention, Interval: o.CleanupInterval, Batch: o.CleanupBatchSize, Logger: b.log, Clock: clk}).Run(runCtx)
	})
	b.bg.Go(func() {
		(&outbox.Cleaner{Store: b.outboxSt, Retention: o.OutboxRetention, Interval: o.CleanupInterval, Batch: o.CleanupBatchSize, Logger: b.log, Clock: clk}).Run(runCtx)
	})
	b.startTelemetry()
	b.stopped = make(chan struct{})
	b.state.Store(stateStarted)
	b.log.InfoContext(ctx, "bus started", "endpoints", len(b.endpoints), "instance_id", b.cfg.instanceID, "transport", b.system)
	return nil
}

// Transport returns the bus's transport (the value its factory built), for
// inspection and transport-specific calls.
func (b *Bus) Transport() transport.Transport { return b.tr }

// Stop stops consuming, waits for in-flight messages (up to ctx's deadline
// and the stop timeout), gives the relay a last pass over committed outbox
// rows, and closes connections. Messages not finished in time are not
// acknowledged: the broker redelivers them and the inbox absorbs any repeat.
// When ctx has no deadline, the stop timeout (WithStopTimeout, 30s) is the
// deadline of the whole Stop; at the deadline the transport's close cancels
// the contexts of handlers still running, and Stop returns within about a
// second more (a handler that ignores its context keeps its goroutine).
//
// While Stop drains, handlers may still call the bus: Publish and Send
// reach the transport, a new Request fails at once with ErrStopping. A
// second Stop waits for the first (up to its own ctx).
func (b *Bus) Stop(ctx context.Context) error {
	select {
	case b.life <- struct{}{}:
	case <-ctx.Done():
		// A Start holds it (migrating, connecting): it is bounded by its
		// own context, not by ours.
		return fmt.Errorf("bus: Stop: a Start is still running: %w", ctx.Err())
	}
	switch b.state.Load() {
	case stateNew:
		<-b.life
		return ErrNotStarted
	case stateStopping:
		done := b.stopped
		<-b.life
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("bus: waiting for another Stop: %w", ctx.Err())
		}
	case stateStopped:
		<-b.life
		return nil
	}
	b.state.Store(stateStopping)
	<-b.life
	defer func() {
		b.state.Store(stateStopped)
		close(b.stopped)
	}()
	if _, ok := ctx.Deadline(); !ok {
		// Without a deadline, the stop timeout bounds the whole Stop, not
		// only the router's close: what follows (the last relay pass, the
		// wait for the router) could otherwise wait for ever on a handler
		// that ignores its context and holds what they need (SQLite's one
		// connection), since its context is canceled only when the
		// transport closes, at the end.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.cfg.stopTimeout)
		defer cancel()
	}
	b.stopTelemetry()
	var errs []error
	b.gate.close() // waits for the database or a transport end; consumers drain
	closed := make(chan error, 1)
	go func() { closed <- b.router.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			errs = append(errs, fmt.Errorf("bus: stop endpoints: %w", err))
		}
	case <-ctx.Done():
		// Closing the transport below cancels what still runs; its
		// messages are not acknowledged and go back to the broker.
		errs = append(errs, fmt.Errorf("bus: stop endpoints: %d deliveries still in flight at the deadline are canceled and handed back unacknowledged: %w",
			b.ctr.inFlight.Load(), ctx.Err()))
	}
	b.replies.close() // no reply queue is declared from now on
	b.cancel()
	// The relay, the cleaners and the reply consumer end with b.cancel;
	// one stuck on a silent database or broker is left behind at ctx's
	// deadline (closing the transport and the store below ends it).
	bgDone := make(chan struct{})
	go func() { b.bg.Wait(); close(bgDone) }()
	select {
	case <-bgDone:
	case <-ctx.Done():
		select { // just canceled: give them a moment
		case <-bgDone:
		case <-time.After(stopGrace):
			errs = append(errs, fmt.Errorf("bus: stop the relay and the cleanup loops: still running %v after the deadline, left behind: %w", stopGrace, ctx.Err()))
		}
	}
	// Flush what committed transactions left in the outbox, within ctx.
	for ctx.Err() == nil {
		n, err := b.relay.DispatchOnce(ctx)
		if err != nil || n == 0 {
			break
		}
	}
	select {
	case <-b.routerDone:
	case <-ctx.Done():
	}
	b.deleteReplyQueue(ctx)
	// The commit watcher (PostgreSQL) stops here; commits after Stop are
	// found by the other instances' polls.
	if err := b.store.Close(); err != nil {
		errs = append(errs, fmt.Errorf("bus: close store: %w", err))
	}
	errs = append(errs, b.closeResources())
	b.log.Info("bus stopped", "instance_id", b.cfg.instanceID)
	return errors.Join(errs...)
}

func (b *Bus) closeResources() error {
	var errs []error
	if b.tr != nil {
		if err := b.tr.Close(); err != nil {
			errs = append(errs, fmt.Errorf("bus: close transport: %w", err))
		}
	}
	if b.ownDB && b.db != nil {
		if err := closeDB(b.db); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func closeDB(db *gorm.DB) error { return gormstore.Close(db) }

// Run starts the bus, blocks until ctx is done, then stops it within the
// stop timeout (WithStopTimeout).
func (b *Bus) Run(ctx context.Context) error {
	if err := b.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.stopTimeout)
	defer cancel()
	return b.Stop(sctx)
}

// Health reports nil when the transport is connected, the database
// answers and the relay keeps up (see CheckHealth and
// WithHealthThresholds); otherwise an error saying which check failed.
func (b *Bus) Health(ctx context.Context) error {
	return b.CheckHealth(ctx).Err()
}

func watermillLogger(l *slog.Logger) watermill.LoggerAdapter {
	// Watermill's per-message logs are debug noise for a bus user; its
	// info (handler start/stop) is debug here too.
	return watermill.NewSlogLoggerWithLevelMapping(slog.New(watermillHandler{l.Handler()}), map[slog.Level]slog.Level{
		slog.LevelInfo:       slog.LevelDebug,
		slog.LevelDebug:      watermill.LevelTrace,
		watermill.LevelTrace: watermill.LevelTrace - 4,
	})
}

// leasedOnly hides an outbox store's ClaimBatch from the relay, which then
// leases its batches (outbox.ClaimLeased).
type leasedOnly struct{ outbox.Store }
