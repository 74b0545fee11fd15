package wmnats

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub"
)

// Config configures the preset: the receive endpoints and the NATS
// settings.
type Config struct {
	endpoint.Endpoints

	// AckWait is how long JetStream waits for an acknowledgement before it
	// delivers a message again. Keep it above your slowest consumer.
	// Defaults to 30s.
	AckWait time.Duration
	// Options are extra nats.Options for every connection (credentials,
	// TLS, reconnect settings). The preset adds a name and unlimited
	// reconnects.
	Options []nats.Option
	// Prefix is put in front of every stream and durable consumer name,
	// so that two services on one server can keep apart. Defaults to "".
	Prefix string
}

// New returns a factory for bus.WithTransport running the bus on NATS
// JetStream at url (nats://host:4222). configure declares the receive
// endpoints and may set Config's fields; it may be nil.
func New(url string, configure func(c *Config)) transport.Factory {
	var c Config
	if configure != nil {
		configure(&c)
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	return wmpubsub.New(func(w *wmpubsub.Config) {
		w.Endpoints = c.Endpoints
		w.System = "nats"
		w.Topics = wmpubsub.Topics{
			Type:  func(s string) string { return c.Prefix + Name(s) },
			Queue: func(s string) string { return c.Prefix + Name("q:"+s) },
		}
		w.Semantics = wmpubsub.Semantics{NackRedelivers: true, NackGoesBehind: true}
		opts := append([]nats.Option{nats.MaxReconnects(-1)}, c.Options...)
		var pubConn *nats.Conn
		w.Publisher = func(ctx context.Context) (message.Publisher, error) {
			conn, err := connect(ctx, url, append(opts, nats.Name("barewire-publisher")))
			if err != nil {
				return nil, err
			}
			pubConn = conn
			return wmnats.NewPublisherWithNatsConn(conn, wmnats.PublisherPublishConfig{
				Marshaler:         Marshaler{},
				SubjectCalculator: wmnats.DefaultSubjectCalculator,
				JetStream:         wmnats.JetStreamConfig{AutoProvision: true},
			}, watermill.NopLogger{})
		}
		w.Subscriber = func(ctx context.Context, queue string) (message.Subscriber, error) {
			// Each subscriber drains its connection when closed, so
			// each has its own.
			conn, err := connect(ctx, url, append(opts, nats.Name("barewire-"+queue)))
			if err != nil {
				return nil, err
			}
			group := c.Prefix + Name("q:"+queue)
			durable := func(_, topic string) string { return durableName(group, topic) }
			sub, err := wmnats.NewSubscriberWithNatsConn(conn, wmnats.SubscriberSubscriptionConfig{
				Unmarshaler:      Marshaler{},
				AckWaitTimeout:   c.AckWait,
				CloseTimeout:     5 * time.Second,
				SubscribeTimeout: 30 * time.Second,
				QueueGroupPrefix: group,
				SubjectCalculator: func(_, topic string) *wmnats.SubjectDetail {
					return &wmnats.SubjectDetail{Primary: topic, QueueGroup: durableName(group, topic)}
				},
				JetStream: wmnats.JetStreamConfig{
					AutoProvision:     true,
					DurablePrefix:     group,
					DurableCalculator: durable,
					SubscribeOptions: []nats.SubOpt{
						nats.ManualAck(), nats.AckExplicit(), nats.DeliverAll(),
						nats.AckWait(c.AckWait), nats.MaxDeliver(-1),
					},
				},
			}, watermill.NopLogger{})
			if err != nil {
				conn.Close()
				return nil, err
			}
			return &subscriber{Subscriber: sub, conn: conn, group: group, ackWait: c.AckWait}, nil
		}
		// A queue's topic is its stream (watermill-nats names the stream
		// after the topic), created by the subscriber's initialization.
		w.QueueExists = func(ctx context.Context, topic string) (bool, error) {
			js, err := jetStream(pubConn)
			if err != nil {
				return false, err
			}
			// A request written just before a lost connection is noticed
			// is lost with it: do not wait the caller's whole deadline.
			ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			defer cancel()
			if _, err := js.StreamInfo(topic, nats.Context(ctx)); err != nil {
				if errors.Is(err, nats.ErrStreamNotFound) {
					return false, nil
				}
				return false, err
			}
			return true, nil
		}
		w.DeleteQueue = func(ctx context.Context, topic string) error {
			js, err := jetStream(pubConn)
			if err != nil {
				return err
			}
			if err := js.DeleteStream(topic, nats.Context(ctx)); err != nil && !errors.Is(err, nats.ErrStreamNotFound) {
				return err
			}
			return nil
		}
		w.Health = func(context.Context) error {
			if pubConn == nil {
				return errors.New("wmnats: not connected yet")
			}
			if s := pubConn.Status(); s != nats.CONNECTED {
				return fmt.Errorf("wmnats: connection %v", s)
			}
			return nil
		}
	})
}

// subscriber creates each durable consumer itself before watermill-nats
// subscribes to it. nats.go deletes a consumer on Unsubscribe when the
// subscription created it: an instance stopping gracefully (watermill-nats
// unsubscribes at Close) would delete the durable its competitors still
// read, and the next subscription would create it again from the start of
// the stream (every retained message delivered again). A subscription that
// binds to an existing consumer leaves it in place.
type subscriber struct {
	*wmnats.Subscriber
	conn    *nats.Conn
	group   string
	ackWait time.Duration
}

// SubscribeInitialize creates the topic's stream, then its durable.
func (s *subscriber) SubscribeInitialize(topic string) error {
	if err := s.Subscriber.SubscribeInitialize(topic); err != nil {
		return err
	}
	return s.ensureConsumer(topic)
}

// Subscribe makes sure the durable exists (the stream may have been
// created since, or the durable deleted by hand) and subscribes.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.SubscribeInitialize(topic); err != nil {
		return nil, err
	}
	return s.Subscriber.Subscribe(ctx, topic)
}

// ensureConsumer adds the durable push consumer of the queue on topic's
// stream with the settings watermill-nats subscribes with; one that
// exists is left as it is.
func (s *subscriber) ensureConsumer(topic string) error {
	js, err := s.conn.JetStream()
	if err != nil {
		return err
	}
	name := durableName(s.group, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.ConsumerInfo(topic, name, nats.Context(ctx)); err == nil {
		return nil
	}
	_, err = js.AddConsumer(topic, &nats.ConsumerConfig{
		Durable: name, DeliverSubject: nats.NewInbox(), DeliverGroup: name,
		AckPolicy: nats.AckExplicitPolicy, AckWait: s.ackWait, MaxDeliver: -1, DeliverPolicy: nats.DeliverAllPolicy,
	}, nats.Context(ctx))
	if err != nil && !errors.Is(err, nats.ErrConsumerNameAlreadyInUse) {
		if _, ierr := js.ConsumerInfo(topic, name); ierr == nil {
			return nil // a competitor created it meanwhile
		}
		return fmt.Errorf("wmnats: create durable %q on stream %q: %w", name, topic, err)
	}
	return nil
}

// lookupTimeout bounds a stream look-up.
const lookupTimeout = 2 * time.Second

// jetStream returns the JetStream context of the publisher's connection.
func jetStream(conn *nats.Conn) (nats.JetStreamContext, error) {
	if conn == nil {
		return nil, errors.New("wmnats: not connected yet")
	}
	return conn.JetStream()
}

func connect(ctx context.Context, url string, opts []nats.Option) (*nats.Conn, error) {
	// nats.Connect does not take a context: retry within ctx so that a
	// server that starts a little after the service is waited for.
	for {
		conn, err := nats.Connect(url, opts...)
		if err == nil {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wmnats: connect to %s: %w", url, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// durableName is the durable consumer (and deliver group) of queue on a
// topic: one per endpoint and stream.
func durableName(group, topic string) string { return group + "__" + topic }

// Name returns s as a NATS stream and subject token: letters, digits and
// '-' stay, every other byte becomes _xx (its hex value), so that distinct
// names stay distinct.
func Name(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "_%02x", c)
	}
	return b.String()
}

// encodedPrefix marks a header whose value is base64-encoded.
const encodedPrefix = "BW-B64-"

// Marshaler is the preset's wire format: watermill-nats's NATSMarshaler
// (UUID in _watermill_message_uuid, metadata as headers, so a
// Watermill-native service reads and writes the same messages) plus
// Nats-Msg-Id, and on receipt the delivery count. Unmarshal never fails: a
// message it cannot read would otherwise be redelivered forever.
type Marshaler struct{}

// Marshal sets Nats-Msg-Id to the message id, suffixed with the
// redelivery count on a delayed redelivery (which must not be dropped as a
// duplicate of the first delivery within the dedup window).
func (Marshaler) Marshal(topic string, msg *message.Message) (*nats.Msg, error) {
	m, err := (&wmnats.NATSMarshaler{}).Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	for k, v := range msg.Metadata {
		// NATS headers lose leading and trailing white space and cannot
		// hold line breaks: carry such a value base64-encoded.
		if v != strings.TrimSpace(v) || strings.ContainsAny(v, "\r\n") {
			m.Header.Del(k)
			m.Header.Set(encodedPrefix+k, base64.StdEncoding.EncodeToString([]byte(v)))
		}
	}
	if msg.UUID != "" {
		id := msg.UUID
		if n := msg.Metadata.Get(wire.HeaderRedeliveryCount); n != "" {
			id += "#r" + n
		}
		m.Header.Set(nats.MsgIdHdr, id)
	}
	return m, nil
}

// Unmarshal reads what Marshal wrote (a repeated header keeps its last
// value) and sets the delivery count from JetStream's metadata.
func (Marshaler) Unmarshal(m *nats.Msg) (*message.Message, error) {
	msg := message.NewMessage(m.Header.Get(wmnats.WatermillUUIDHdr), m.Data)
	for k, v := range m.Header {
		switch k {
		case wmnats.WatermillUUIDHdr, nats.MsgIdHdr:
			continue
		}
		if len(v) == 0 {
			continue
		}
		val := v[len(v)-1]
		if name, ok := strings.CutPrefix(k, encodedPrefix); ok {
			if b, err := base64.StdEncoding.DecodeString(val); err == nil {
				k, val = name, string(b)
			}
		}
		msg.Metadata.Set(k, val)
	}
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 0 {
		msg.Metadata.Set(transport.MetaDeliveryCount, strconv.FormatUint(md.NumDelivered-1, 10))
		msg.Metadata.Set(transport.MetaRedelivered, strconv.FormatBool(md.NumDelivered > 1))
	}
	return msg, nil
}
