package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Status of an outbox row.
type Status string

const (
	// StatusPending rows wait for the relay.
	StatusPending Status = "pending"
	// StatusDelivered rows were confirmed by the transport; they are kept
	// until OutboxRetention unless DeleteOnDeliver is set.
	StatusDelivered Status = "delivered"
	// StatusParked rows failed MaxAttempts times; they wait for an operator
	// (Requeue) and never block the rows behind them.
	StatusParked Status = "parked"
)

// Message is one outbox row: a fully serialized message and where it goes.
type Message struct {
	// ID is the row's sequence number, assigned by the store on Add.
	ID int64
	// MessageID is the end-to-end message id (AMQP message_id, inbox key).
	MessageID string
	// Destination is "exchange:<name>" for a publish or "queue:<name>" for a send.
	Destination string
	// RoutingKey is used with exchange destinations; empty means the default.
	RoutingKey    string
	MessageType   string
	ContentType   string
	CorrelationID string
	// Headers are every other header, including W3C trace context.
	Headers map[string]string
	Payload []byte
	// Delay holds a new row back from the relay: Add makes it claimable
	// Delay after the insert, by the database's clock (a delayed
	// redelivery waits this way, durably). Zero means at once; negative
	// is refused. Add reads it; rows read back leave it zero.
	Delay time.Duration

	CreatedAt time.Time
	// AvailableAt is when the row becomes claimable (set on rows read back
	// by Claim and List; Add leaves it zero).
	AvailableAt time.Time

	Status      Status
	Attempts    int
	LastError   string
	DeliveredAt *time.Time
}

// Store is what the outbox needs from a database. gormstore implements it for
// PostgreSQL and SQLite; outbox/outboxtest is its conformance suite.
//
// Add writes inside the caller's transaction, which the implementation finds
// in ctx (the way it put it there is its own business). Every other method
// runs its own short transaction and uses the database's clock.
type Store interface {
	// Add inserts rows in the transaction carried by ctx. It returns
	// ErrNoTransaction when ctx carries none.
	Add(ctx context.Context, msgs []*Message) error
	// Claim leases up to limit pending rows whose lease is free or expired,
	// oldest first, to owner for lease. Rows leased by a live owner are
	// skipped, never waited for.
	Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]*Message, error)
	// MarkDelivered marks (or deletes, when del is true) the rows still
	// leased by owner. It returns how many rows it changed.
	MarkDelivered(ctx context.Context, owner string, ids []int64, del bool) (int, error)
	// Release returns rows leased by owner to pending. When countAttempt is
	// true each row's attempt count grows by one, lastErr is recorded, the
	// row becomes claimable again only after retryAfter, and rows that have
	// reached maxAttempts are parked instead. When countAttempt is false,
	// lastErr and maxAttempts are ignored and a positive retryAfter still
	// holds the row back that long (a *RetryAfterError: the row was
	// published, and Cancel leaves it from then on); zero makes it
	// claimable at once.
	Release(ctx context.Context, owner string, ids []int64, lastErr string, countAttempt bool, retryAfter time.Duration, maxAttempts int) error
	// Requeue moves parked rows back to pending with their attempts reset.
	// With no ids, every parked row is re-queued. It returns how many moved.
	Requeue(ctx context.Context, ids []int64) (int, error)
	// Cleanup deletes at most batch delivered rows older than retention and
	// returns how many it deleted.
	Cleanup(ctx context.Context, retention time.Duration, batch int) (int, error)
	// Stats counts the rows that may need attention (pending, scheduled,
	// parked). Health checks and metrics call it: its cost must not grow
	// with the delivered rows kept for OutboxRetention.
	Stats(ctx context.Context) (Stats, error)
	// List returns rows matching q, oldest first.
	List(ctx context.Context, q Query) ([]*Message, error)
	// Cancel deletes the pending rows with messageID that cannot have
	// reached the broker and returns how many it deleted: rows not yet due
	// (scheduled, or a delayed redelivery waiting for its time) that never
	// failed, were never released by a *RetryAfterError and no relay
	// holds. A due row is not touched: a relay may have published it
	// already (its settlement may have failed and left it pending). It
	// runs in the transaction carried by ctx when there is one (so it
	// takes effect only if that commits), in a statement of its own
	// otherwise.
	Cancel(ctx context.Context, messageID string) (int, error)
	// NextDue returns how long, by the database's clock, until the
	// earliest pending row that is not yet due becomes due; ok is false
	// when no pending row lies in the future. The relay sleeps until then
	// instead of a whole PollingInterval.
	NextDue(ctx context.Context) (d time.Duration, ok bool, err error)
}

// BatchClaimer is implemented by stores that hold a claimed batch
// themselves until it is settled, instead of the relay leasing its rows
// through Claim, MarkDelivered and Release. gormstore does on PostgreSQL:
// the rows stay locked (FOR UPDATE) in a transaction that the settlement
// commits, so claiming writes nothing and a relay that dies releases its
// rows with its connection. The relay uses ClaimBatch when its Store
// implements it, ClaimLeased otherwise.
type BatchClaimer interface {
	// ClaimBatch claims up to limit rows as Claim does. hold bounds how
	// long the batch may stay unsettled: past it the store may give the
	// rows back (a relay that froze mid-batch), as an expired lease does.
	// A batch with no messages needs no Settle.
	ClaimBatch(ctx context.Context, owner string, limit int, hold time.Duration) (Batch, error)
}

// Batch is a claimed batch of outbox rows.
type Batch interface {
	// Messages are the claimed rows, lowest id first.
	Messages() []*Message
	// Settle records what became of each row and ends the batch, whatever
	// it returns; rows s does not name return to pending, claimable at
	// once, without an attempt. Call it exactly once. When it fails, what
	// it could not record is as if never claimed (for a leased batch, once
	// the lease expires): confirmed rows among it are sent again, a
	// duplicate the receiving inbox absorbs. A batch that settles step by
	// step (a leased one) and recorded its Delivered rows before a later
	// step failed returns an error wrapping ErrDeliveredRecorded.
	Settle(ctx context.Context, s Settlement) error
}

// ErrDeliveredRecorded is wrapped by a Settle error after which the
// settlement's Delivered rows were recorded all the same (a failed row's
// release failed after the mark, say): they will not be sent again.
var ErrDeliveredRecorded = errors.New("outbox: the delivered rows were recorded; another step of the settlement failed")

// Settlement is what a relay pass decided for the rows of a batch.
type Settlement struct {
	// Delivered rows were confirmed by the transport: marked delivered,
	// or deleted when Delete is set.
	Delivered []int64
	Delete    bool
	// Failed rows count an attempt each (see Store.Release).
	Failed []FailedRow
	// Later rows become claimable again after LaterAfter, without an
	// attempt (a *RetryAfterError).
	Later      []int64
	LaterAfter time.Duration
}

// FailedRow is a row whose delivery failed.
type FailedRow struct {
	ID    int64
	Error string
	// RetryAfter is when the row may be claimed again.
	RetryAfter time.Duration
	// MaxAttempts parks the row once its attempts reach it (<= 0 never).
	MaxAttempts int
}

// ClaimBatch claims a batch from s as the Relay does: through s's own
// ClaimBatch when s is a BatchClaimer, through ClaimLeased otherwise.
func ClaimBatch(ctx context.Context, s Store, owner string, limit int, hold time.Duration) (Batch, error) {
	if bc, ok := s.(BatchClaimer); ok {
		return bc.ClaimBatch(ctx, owner, limit, hold)
	}
	return ClaimLeased(ctx, s, owner, limit, hold)
}

// ClaimLeased claims a batch from s through Claim, leased to owner for
// lease; its Settle applies the settlement with MarkDelivered and Release,
// each step on its own (a step that fails leaves its rows leased until the
// lease expires, and the others are still applied).
func ClaimLeased(ctx context.Context, s Store, owner string, limit int, lease time.Duration) (Batch, error) {
	msgs, err := s.Claim(ctx, owner, limit, lease)
	if err != nil {
		return nil, err
	}
	return &leasedBatch{s: s, owner: owner, msgs: msgs}, nil
}

type leasedBatch struct {
	s     Store
	owner string
	msgs  []*Message
}

func (b *leasedBatch) Messages() []*Message { return b.msgs }

func (b *leasedBatch) Settle(ctx context.Context, st Settlement) error {
	var errs []error
	named := make(map[int64]bool, len(b.msgs))
	marked := false
	if len(st.Delivered) > 0 {
		for _, id := range st.Delivered {
			named[id] = true
		}
		if _, err := b.s.MarkDelivered(ctx, b.owner, st.Delivered, st.Delete); err != nil {
			errs = append(errs, fmt.Errorf("mark delivered: %w", err))
		} else {
			marked = true
		}
	}
	for _, f := range st.Failed {
		named[f.ID] = true
		if err := b.s.Release(ctx, b.owner, []int64{f.ID}, f.Error, true, f.RetryAfter, f.MaxAttempts); err != nil {
			errs = append(errs, fmt.Errorf("release failed row: %w", err))
		}
	}
	if len(st.Later) > 0 {
		for _, id := range st.Later {
			named[id] = true
		}
		if err := b.s.Release(ctx, b.owner, st.Later, "", false, st.LaterAfter, 0); err != nil {
			errs = append(errs, fmt.Errorf("release for a later send: %w", err))
		}
	}
	var rest []int64
	for _, m := range b.msgs {
		if !named[m.ID] {
			rest = append(rest, m.ID)
		}
	}
	if len(rest) > 0 {
		if err := b.s.Release(ctx, b.owner, rest, "", false, 0, 0); err != nil {
			errs = append(errs, fmt.Errorf("release: %w", err))
		}
	}
	if marked && len(errs) > 0 {
		errs = append([]error{ErrDeliveredRecorded}, errs...)
	}
	return errors.Join(errs...)
}

// Notifier is implemented by stores that can wake relays in other processes
// when a transaction that wrote outbox rows commits (PostgreSQL LISTEN/NOTIFY).
type Notifier interface {
	// Listen calls wake after every notified commit until ctx is done. It
	// returns when ctx is done or the listening connection cannot be kept.
	Listen(ctx context.Context, wake func()) error
}

// Stats are outbox row counts. Delivered rows are not counted: they are
// history, and counting them would cost health checks and metric scrapes
// a scan of every row kept (list them with Query{Status: StatusDelivered}).
type Stats struct {
	// Pending counts the rows waiting for the relay, Scheduled ones
	// included.
	Pending int64
	// Scheduled counts the pending rows not yet due that never failed
	// (scheduled messages, delayed redeliveries, and rows waiting out a
	// *RetryAfterError, for seconds); a failed row waiting for its retry
	// is not one.
	Scheduled int64
	Parked    int64
	// OldestPending is since when the longest-waiting pending row should
	// have left: its due time (available_at; the creation time of a row
	// published without a schedule), or its creation time once a delivery
	// of it failed. Zero if none. Rows scheduled for later do not count
	// until they fall due: they are not late.
	OldestPending time.Time
}

// Query filters List.
type Query struct {
	// Status filters by status; empty means any.
	Status Status
	// AfterID pages: only rows with ID > AfterID.
	AfterID int64
	// Limit caps the result; 0 means 100.
	Limit int
	// Scheduled keeps only pending rows not yet due (available_at in the
	// future by the database's clock) that never failed: scheduled
	// messages and delayed redeliveries waiting for their time.
	Scheduled bool
}

// ErrNoTransaction is returned by Store.Add when ctx carries no transaction.
var ErrNoTransaction = errors.New("outbox: no transaction in context; use bus.PublishTx with a *gorm.DB transaction")

// Transport delivers outbox messages to the broker.
type Transport interface {
	// Deliver sends msgs and returns one error per message, in order: nil
	// means the broker confirmed it. Implementations pipeline confirms. An
	// error wrapping ErrTransportUnavailable means the message was not
	// judged by the broker (connection down); it does not count as an attempt.
	// An error wrapping ErrUndeliverable parks the row at once. A
	// *RetryAfterError (only when ctx was marked by WithRetryAfter) sends
	// the message again after its After, without counting an attempt. Any
	// other error is charged to that message alone (an attempt).
	Deliver(ctx context.Context, msgs []*Message) []error
}

// ErrTransportUnavailable marks delivery errors caused by the transport being
// down rather than by the message.
var ErrTransportUnavailable = errors.New("outbox: transport unavailable")

// ErrUndeliverable marks delivery errors of a message the transport can
// never send as it is (a 300-byte correlation id written by raw SQL, say):
// the relay parks its row at once instead of retrying it MaxAttempts times.
var ErrUndeliverable = errors.New("outbox: message cannot be delivered as it is")

// RetryAfterError is a delivery result that is neither a success nor a
// failure of the message: the transport published it, but cannot trust the
// broker's confirm yet (the RabbitMQ transport's suspect window after a
// failover, see docs/guarantees.md) and must send it again once After has
// passed. Err wraps ErrTransportUnavailable, so a caller that does not know
// this type treats the message as not delivered and retries it without
// counting an attempt.
//
// A transport returns it only when the caller asked for it with
// WithRetryAfter (the relay does: it releases the row without counting an
// attempt, claimable again after After, and the row is marked delivered
// only when a later delivery is trusted). Without it the transport waits
// and sends the message again itself before Deliver returns.
type RetryAfterError struct {
	// After is how long to wait before sending the message again.
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v (send again in %v)", e.Err, e.After.Round(time.Millisecond))
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

type retryAfterKey struct{}

// WithRetryAfter returns ctx marked to tell Transport.Deliver that its
// caller handles *RetryAfterError results (by sending those messages again
// after their After). The relay marks the context of every Deliver.
func WithRetryAfter(ctx context.Context) context.Context {
	return context.WithValue(ctx, retryAfterKey{}, true)
}

// RetryAfterAllowed reports whether ctx was marked by WithRetryAfter.
func RetryAfterAllowed(ctx context.Context) bool {
	ok, _ := ctx.Value(retryAfterKey{}).(bool)
	return ok
}
