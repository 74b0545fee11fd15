package wmamqp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
	"github.com/barewire-go/barewire/transport/wmpubsub"
)

// Config configures the preset: the receive endpoints and the queues'
// settings.
type Config struct {
	endpoint.Endpoints

	// QueueArgs are the arguments every endpoint queue is declared with
	// (for instance {"x-queue-type": "quorum"}); they must match those of
	// a queue that already exists. Defaults to none (classic queues).
	QueueArgs map[string]any
	// PrefetchCount is each consumer's prefetch. Defaults to 1, as
	// watermill-amqp handles one message at a time per subscription.
	PrefetchCount int
}

// publishChannels is how many channels the publisher keeps open between
// publishes (watermill-amqp opens and closes one per Publish without a
// pool); it is also how many publishes run at once.
const publishChannels = 4

// queueTopic marks the topic of a queue: sent through the default
// exchange with the queue as routing key.
const queueTopic = "queue:"

// New returns a factory for bus.WithTransport running the bus through
// watermill-amqp on the RabbitMQ at url. configure declares the receive
// endpoints and may set Config's fields; it may be nil.
func New(url string, configure func(c *Config)) transport.Factory {
	var c Config
	if configure != nil {
		configure(&c)
	}
	if c.PrefetchCount <= 0 {
		c.PrefetchCount = 1
	}
	config := func(queue string) wamqp.Config {
		cfg := wamqp.NewDurablePubSubConfig(url, func(string) string { return queue })
		cfg.Marshaler = Marshaler{}
		cfg.Exchange.GenerateName = func(topic string) string {
			if strings.HasPrefix(topic, queueTopic) {
				return "" // the default exchange
			}
			return topic
		}
		cfg.Publish.GenerateRoutingKey = func(topic string) string {
			q, _ := strings.CutPrefix(topic, queueTopic)
			if q == topic {
				return ""
			}
			return q
		}
		cfg.Publish.ConfirmDelivery = true
		cfg.Queue.Arguments = amqp.Table(c.QueueArgs)
		cfg.Consume.Qos.PrefetchCount = c.PrefetchCount
		return cfg
	}
	var (
		mu   sync.Mutex
		conn *wamqp.ConnectionWrapper
		adm  = &admin{url: url}
	)
	connection := func(ctx context.Context) (*wamqp.ConnectionWrapper, error) {
		mu.Lock()
		defer mu.Unlock()
		if conn != nil {
			return conn, nil
		}
		for {
			cw, err := wamqp.NewConnection(wamqp.ConnectionConfig{AmqpURI: url}, watermill.NopLogger{})
			if err == nil {
				conn = cw
				return conn, nil
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("wmamqp: connect: %w", err)
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return wmpubsub.New(func(w *wmpubsub.Config) {
		w.Endpoints = c.Endpoints
		w.System = "rabbitmq"
		w.Topics = wmpubsub.Topics{
			Type:  func(s string) string { return s },
			Queue: func(s string) string { return queueTopic + s },
		}
		w.Semantics = wmpubsub.Semantics{NackRedelivers: true}
		w.Publisher = func(ctx context.Context) (message.Publisher, error) {
			cw, err := connection(ctx)
			if err != nil {
				return nil, err
			}
			return newPublisher(cw, config("")), nil
		}
		w.Subscriber = func(ctx context.Context, queue string) (message.Subscriber, error) {
			cw, err := connection(ctx)
			if err != nil {
				return nil, err
			}
			return wamqp.NewSubscriberWithConnection(config(queue), watermill.NopLogger{}, cw)
		}
		w.QueueExists = func(ctx context.Context, topic string) (bool, error) {
			ok := false
			err := adm.do(ctx, func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclarePassive(strings.TrimPrefix(topic, queueTopic), true, false, false, false, nil)
				var ae *amqp.Error
				if errors.As(err, &ae) && ae.Code == amqp.NotFound {
					return nil
				}
				ok = err == nil
				return err
			})
			return ok, err
		}
		w.DeleteQueue = func(ctx context.Context, topic string) error {
			return adm.do(ctx, func(ch *amqp.Channel) error {
				_, err := ch.QueueDelete(strings.TrimPrefix(topic, queueTopic), false, false, false)
				return err
			})
		}
		w.Health = func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if conn == nil || !conn.IsConnected() {
				return errors.New("wmamqp: not connected to RabbitMQ")
			}
			return nil
		}
		w.OnClose = func() error {
			adm.close()
			mu.Lock()
			defer mu.Unlock()
			if conn == nil {
				return nil
			}
			return conn.Close()
		}
	})
}

// admin is a plain connection of the preset's own for the queue look-ups
// and deletions watermill-amqp offers no call for (a passive declare, which
// closes its channel when the queue is missing). It is dialed on first use
// and again after it fails.
type admin struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection
}

// do runs f on a fresh channel; a failed channel is dropped with the
// error f saw.
func (a *admin) do(ctx context.Context, f func(ch *amqp.Channel) error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil || a.conn.IsClosed() {
		conn, err := amqp.DialConfig(a.url, amqp.Config{Properties: amqp.Table{"connection_name": "barewire wmamqp admin"}})
		if err != nil {
			return fmt.Errorf("wmamqp: connect: %w: %w", err, outbox.ErrTransportUnavailable)
		}
		a.conn = conn
	}
	ch, err := a.conn.Channel()
	if err != nil {
		_ = a.conn.Close()
		a.conn = nil
		return fmt.Errorf("wmamqp: open channel: %w: %w", err, outbox.ErrTransportUnavailable)
	}
	defer func() { _ = ch.Close() }()
	if err := ctx.Err(); err != nil {
		return err
	}
	return f(ch)
}

func (a *admin) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		_ = a.conn.Close()
		a.conn = nil
	}
}

// publisher charges to the connection the publish errors of a connection
// that is gone before watermill-amqp noticed it (a write on a closed
// socket when it opens its channel), which Health cannot see yet.
// publisher publishes through publishChannels watermill-amqp Publishers,
// each with one pooled channel and used by one publish at a time, and
// replaces a Publisher whose publish failed with the connection.
//
// watermill-amqp v3.0.2's channel pool is not safe past a connection loss,
// which is why the preset does not share one pool between publishes: a
// pooled channel whose reopen meets the dead connection is dropped from
// the pool for good with a nil *amqp.Channel (the pool shrinks until
// Publish blocks for ever, and Close then panics on it), and a channel
// closed while another publish takes it from the pool panics in
// pooledChannel.validate on the nil close error. With one channel per
// Publisher and one user per Publisher, a failed Publisher is closed by
// the publish that saw it fail, with nobody else on it; a panic out of
// watermill-amqp is turned into an error and retires the Publisher too.
type publisher struct {
	conn   *wamqp.ConnectionWrapper
	config wamqp.Config

	// slots holds publishChannels entries: a Publisher, or nil where one
	// is to be opened. A publish takes an entry and puts one back.
	slots  chan *wamqp.Publisher
	closed atomic.Bool
}

func newPublisher(conn *wamqp.ConnectionWrapper, config wamqp.Config) *publisher {
	config.Publish.ChannelPoolSize = 1
	p := &publisher{conn: conn, config: config, slots: make(chan *wamqp.Publisher, publishChannels)}
	for range publishChannels {
		p.slots <- nil
	}
	return p
}

func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	if p.closed.Load() {
		return errors.New("wmamqp: publisher is closed")
	}
	pub := <-p.slots
	err := p.publish(&pub, topic, msgs)
	if p.closed.Load() && pub != nil {
		_ = closePublisher(pub) // Close ran while this publish held pub
		pub = nil
	}
	p.slots <- pub
	return err
}

// publish publishes msgs on *pub, opening it first if it is nil, and
// closes it and sets it to nil if the publish failed with the connection.
func (p *publisher) publish(pub **wamqp.Publisher, topic string, msgs []*message.Message) (err error) {
	if *pub == nil {
		if !p.conn.IsConnected() {
			return fmt.Errorf("wmamqp: not connected to RabbitMQ: %w", outbox.ErrTransportUnavailable)
		}
		np, err := wamqp.NewPublisherWithConnection(p.config, watermill.NopLogger{}, p.conn)
		if err != nil {
			return fmt.Errorf("wmamqp: open a publisher channel: %w: %w", err, outbox.ErrTransportUnavailable)
		}
		*pub = np
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("wmamqp: watermill-amqp failed on a broken channel (%v): %w", r, outbox.ErrTransportUnavailable)
		}
		if err != nil && errors.Is(err, outbox.ErrTransportUnavailable) {
			_ = closePublisher(*pub)
			*pub = nil
		}
	}()
	err = (*pub).Publish(topic, msgs...)
	// Decided by what failed: an error of the connection, or a connection
	// that is down after the publish failed.
	if err != nil && (connectionError(err) || !p.conn.IsConnected()) {
		err = fmt.Errorf("%w: %w", err, outbox.ErrTransportUnavailable)
	}
	return err
}

// Close closes the Publishers not in use; a publish in flight closes its
// own when it ends.
func (p *publisher) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	var errs []error
	for range publishChannels {
		select {
		case pub := <-p.slots:
			if pub != nil {
				errs = append(errs, closePublisher(pub))
			}
			defer func() { p.slots <- nil }()
		default:
		}
	}
	return errors.Join(errs...)
}

// closePublisher closes pub, turning the panic watermill-amqp v3.0.2
// raises on a pooled channel that failed to reopen (see publisher) into an
// error; that channel is nil, there is nothing left to close.
func closePublisher(pub *wamqp.Publisher) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("wmamqp: close publisher: a channel failed to reopen (%v)", r)
		}
	}()
	return pub.Close()
}

// connectionError reports whether err says the connection to the broker
// failed rather than the message.
func connectionError(err error) bool {
	var ne net.Error
	return errors.Is(err, amqp.ErrClosed) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.As(err, &ne)
}

// Marshaler writes and reads transport/rabbitmq's wire format, plus the
// _watermill_message_uuid header watermill-amqp's DefaultMarshaler reads.
// Unmarshal never fails (a header that is not a string, such as a quorum
// queue's x-delivery-count, is rendered as one), so that no delivery is
// nacked and requeued in a loop for its headers.
type Marshaler struct{}

// Marshal maps the message's metadata onto AMQP properties and headers.
func (Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	md := msg.Metadata
	m := &outbox.Message{
		MessageID:     msg.UUID,
		MessageType:   md.Get(wire.HeaderMessageType),
		ContentType:   md.Get(wire.HeaderContentType),
		CorrelationID: md.Get(wire.HeaderCorrelationID),
		Payload:       msg.Payload,
		Headers:       map[string]string(md),
	}
	_, _, pub := rabbitmq.PublishingFor(m)
	if pub.Headers == nil {
		pub.Headers = amqp.Table{}
	}
	if msg.UUID != "" {
		pub.Headers[wire.HeaderWatermillUUID] = msg.UUID
	}
	return pub, nil
}

// Unmarshal reads a delivery as transport/rabbitmq does.
func (Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	return rabbitmq.MessageFromDelivery(&d), nil
}
