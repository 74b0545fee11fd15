package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/reliability/workload"
)

// The poison profile (-poison-ratio): the producer sends each class of
// workload.PoisonClasses at that ratio and records every attempt in the
// poison table; the consumers misbehave on messages carrying
// workload.HeaderPoisonClass. See package reliability's Poison profile.

func (p *producer) poisonClasses() []workload.PoisonSpec {
	if p.cfg.PoisonRatio <= 0 {
		return nil
	}
	return workload.PoisonClasses(p.cfg.Transport)
}

// poison sends one message of class s and records it: in the publish's own
// transaction when the publish is accepted, after the rollback when it is
// refused (the refusal is the class's terminal state, with its error).
func (p *producer) poison(ctx context.Context, s workload.PoisonSpec) error {
	n := p.cfg.Names
	seq := p.seq.Add(1)
	key := fmt.Sprintf("%s/%d", p.tag, seq)
	id := fmt.Sprintf("%s/poison/%s/%s", n.Run, s.Class, key)
	h := bus.Headers{bus.HeaderMessageType: n.OrderType(),
		workload.HeaderPoisonClass: string(s.Class), workload.HeaderPoisonKey: key}
	var msg any = workload.Order{ID: id, Seq: seq, Producer: p.cfg.Instance}
	dest := "" // Publish
	switch s.Class {
	case workload.PoisonBadJSON:
		msg = bus.Raw{Type: n.OrderType(), ContentType: "application/json", Body: []byte(`{"id": "` + id + `", "seq": oops`)}
	case workload.PoisonUnknownType:
		h[bus.HeaderMessageType] = n.UnknownType()
		dest = n.Ledger()
	case workload.PoisonPubLongCorrelation:
		h[bus.HeaderCorrelationID] = strings.Repeat("c", workload.PoisonShortStringLen)
	case workload.PoisonPubLongHeaderKey:
		h[strings.Repeat("k", workload.PoisonShortStringLen)] = "v"
	case workload.PoisonPubLongID:
		id = id + "/" + strings.Repeat("i", workload.PoisonLongIDLen)
	case workload.PoisonPubNULID:
		id = id + "\x00nul"
	case workload.PoisonPubBadUTF8ID:
		// Raw GUID bytes, as a .NET producer might put in message_id.
		id = "\xff\xfe\x01\x9c" + id
	case workload.PoisonSendMissingQueue:
		dest = "queue:" + n.MissingQueue()
	case workload.PoisonRawLongID, workload.PoisonRawNULID, workload.PoisonRawBadUTF8ID:
		return p.poisonRaw(ctx, s, key, id)
	}
	h[bus.HeaderMessageID] = id
	var textID any // NULL when PostgreSQL cannot store the id as text
	if utf8.ValidString(id) && !strings.ContainsRune(id, 0) {
		textID = id
	}
	var pubErr error
	err := p.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if dest == "" {
			pubErr = p.b.PublishTx(ctx, tx, msg, h)
		} else {
			pubErr = p.b.SendTx(ctx, tx, dest, msg, h)
		}
		if pubErr != nil {
			return pubErr
		}
		return p.recordPoison(tx, s, key, textID, id, "sent", "")
	})
	if err == nil {
		p.poisonSent.Add(1)
		return nil
	}
	if pubErr == nil {
		return err // the database failed, not the publish
	}
	p.poisonRefused.Add(1)
	return p.recordPoison(p.db.WithContext(ctx), s, key, textID, id, "refused", pubErr.Error())
}

func (p *producer) recordPoison(db *gorm.DB, s workload.PoisonSpec, key string, textID any, id, outcome, errText string) error {
	return db.Exec(`INSERT INTO `+p.cfg.Names.Table(workload.TablePoison)+` (poison_key, class, message_id, id_hex, endpoints, outcome, error) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		key, string(s.Class), textID, hex.EncodeToString([]byte(id)), s.Endpoints, outcome, strings.ToValidUTF8(strings.ReplaceAll(errText, "\x00", `\x00`), "?")).Error
}

// poisonRaw sends a bad id the way a foreign producer would: a plain AMQP
// publish (amqp091, confirmed) to the ledger queue, bypassing the bus's
// checks. A long id goes in the message-id header, since the message_id
// property is a 255-byte short string.
func (p *producer) poisonRaw(ctx context.Context, s workload.PoisonSpec, key, id string) error {
	switch s.Class {
	case workload.PoisonRawLongID:
		id = id + "/" + strings.Repeat("i", workload.PoisonLongIDLen)
	case workload.PoisonRawNULID:
		id = id + "\x00nul"
	case workload.PoisonRawBadUTF8ID:
		id = "\xff\xfe\x01\x9c" + id
	}
	pub := amqp.Publishing{
		ContentType: "application/json",
		Headers: amqp.Table{bus.HeaderMessageType: p.cfg.Names.OrderType(),
			workload.HeaderPoisonClass: string(s.Class), workload.HeaderPoisonKey: key},
		Body: []byte(fmt.Sprintf(`{"id":%q,"seq":1}`, key)),
	}
	if len(id) > 255 {
		pub.Headers[bus.HeaderMessageID] = id
	} else {
		pub.MessageId = id
	}
	if p.raw == nil {
		return errors.New("raw AMQP classes need the RabbitMQ transport")
	}
	if err := p.raw.publish(ctx, p.cfg.Names.Ledger(), pub); err != nil {
		return fmt.Errorf("raw AMQP publish: %w", err)
	}
	p.poisonSent.Add(1)
	var textID any
	if utf8.ValidString(id) && !strings.ContainsRune(id, 0) {
		textID = id
	}
	return p.recordPoison(p.db.WithContext(ctx), s, key, textID, id, "sent", "")
}

// rawSender is a plain amqp091 connection with publisher confirms, shared
// by the producer's workers.
type rawSender struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel
}

func (r *rawSender) publish(ctx context.Context, queue string, pub amqp.Publishing) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil || r.ch.IsClosed() {
		if r.conn != nil {
			_ = r.conn.Close()
		}
		conn, err := amqp.Dial(r.url)
		if err != nil {
			return err
		}
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Confirm(false)
		}
		if err != nil {
			_ = conn.Close()
			return err
		}
		r.conn, r.ch = conn, ch
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conf, err := r.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, pub)
	if err != nil {
		return err
	}
	ok, err := conf.WaitContext(ctx)
	if err == nil && !ok {
		err = errors.New("the broker nacked the publish")
	}
	return err
}

func (r *rawSender) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil {
		_ = r.conn.Close()
	}
}

// closedAddr is a local address nothing listens on: the err-url classes'
// HTTP call fails there at once with a real *url.Error.
var closedAddr = sync.OnceValue(func() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:9"
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
})

var chargeClient = &http.Client{Timeout: 2 * time.Second}

// misbehave is what an order consumer does with a poison message of class
// c, after writing its effect (which must never commit). It returns
// handled=false for classes that have nothing to do in the consumer.
func misbehave(ctx context.Context, c workload.PoisonClass, tx *gorm.DB) (err error, handled bool) {
	charge := func() error {
		resp, err := chargeClient.Post("http://"+closedAddr()+"/charge", "application/json", strings.NewReader("{}"))
		if err == nil {
			_ = resp.Body.Close()
			return errors.New("charge: unexpected success")
		}
		return fmt.Errorf("charge: %w", err)
	}
	switch c {
	case workload.PoisonErrPlain:
		return errors.New("poison err-plain: charge declined"), true
	case workload.PoisonErrDeadline:
		return fmt.Errorf("poison err-deadline: %w", fmt.Errorf("charge: %w", context.DeadlineExceeded)), true
	case workload.PoisonErrURL:
		return fmt.Errorf("poison err-url: %w", charge()), true
	case workload.PoisonPermPlain:
		return endpoint.Permanent(errors.New("poison perm-plain: charge declined")), true
	case workload.PoisonPermDeadline:
		return endpoint.Permanent(fmt.Errorf("poison perm-deadline: %w", fmt.Errorf("charge: %w", context.DeadlineExceeded))), true
	case workload.PoisonPermURL:
		return endpoint.Permanent(fmt.Errorf("poison perm-url: %w", charge())), true
	case workload.PoisonPanic:
		panic("poison panic: the consumer crashed")
	case workload.PoisonAbortedTx:
		// A failing statement whose error the consumer ignores: the
		// transaction is aborted and the inbox's mark fails with 25P02.
		_ = tx.Exec(`SELECT 1/0`).Error
		return nil, true
	}
	return nil, false
}
