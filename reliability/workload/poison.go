package workload

import "strings"

// Headers the poison profile's producer puts on every poison message (when
// the publish accepts them): the consumers misbehave by class, and the
// checker maps a dead letter back to its poison row by key, whatever its
// (possibly unstorable) message id.
const (
	HeaderPoisonClass = "X-Poison-Class"
	HeaderPoisonKey   = "X-Poison-Key"
)

// Terminal states a poison message must reach (PoisonSpec.Terminal).
const (
	// TerminalDeadLetter: dead-lettered by every endpoint it reached, with
	// a BW-Fault-Reason naming what went wrong.
	TerminalDeadLetter = "dead-lettered"
	// TerminalRefused: the publish call returned an error (nothing sent).
	TerminalRefused = "refused at publish"
	// TerminalRefusedOrParked: refused at publish, or, where the transport
	// can only find out at relay time (a send to a missing RabbitMQ queue),
	// parked in the outbox with its reason.
	TerminalRefusedOrParked = "refused at publish or parked with its reason"
)

// PoisonClass is one kind of poison message of the poison profile.
type PoisonClass string

// Poison classes. The consumer-error classes publish an ordinary order
// whose consumers (ledger and notify) write their effect and then fail in
// the class's way; the publish classes carry a header or id the transport
// cannot carry; the raw classes come from a plain AMQP client.
const (
	PoisonErrPlain     PoisonClass = "err-plain"
	PoisonErrDeadline  PoisonClass = "err-deadline"
	PoisonErrURL       PoisonClass = "err-url"
	PoisonPermPlain    PoisonClass = "perm-plain"
	PoisonPermDeadline PoisonClass = "perm-deadline"
	PoisonPermURL      PoisonClass = "perm-url"
	PoisonPanic        PoisonClass = "panic"
	PoisonAbortedTx    PoisonClass = "aborted-tx"
	PoisonBadJSON      PoisonClass = "bad-json"
	PoisonUnknownType  PoisonClass = "unknown-type"

	PoisonPubLongCorrelation PoisonClass = "pub-long-correlation-id"
	PoisonPubLongHeaderKey   PoisonClass = "pub-long-header-key"
	PoisonPubLongID          PoisonClass = "pub-long-id"
	PoisonPubNULID           PoisonClass = "pub-nul-id"
	PoisonPubBadUTF8ID       PoisonClass = "pub-bad-utf8-id"
	PoisonSendMissingQueue   PoisonClass = "send-missing-queue"

	PoisonRawLongID    PoisonClass = "raw-long-id"
	PoisonRawNULID     PoisonClass = "raw-nul-id"
	PoisonRawBadUTF8ID PoisonClass = "raw-bad-utf8-id"
)

// PoisonSpec says how a class is sent and what must become of it.
type PoisonSpec struct {
	Class PoisonClass
	// Terminal is one of the Terminal* states.
	Terminal string
	// Endpoints is how many endpoints receive it (each must dead-letter it).
	Endpoints int
	// Reasons: a dead letter's BW-Fault-Reason must contain one of these
	// (compared in lower case).
	Reasons []string
	// Permanent classes must be dead-lettered without a retry
	// (BW-Fault-Attempts 1, or 0 when refused before any consumer ran).
	Permanent bool
	// RabbitMQOnly classes are sent on the RabbitMQ transport only.
	RabbitMQOnly bool
}

// ReasonOK reports whether a dead letter's reason is the one the class
// must produce.
func (s PoisonSpec) ReasonOK(reason string) bool {
	reason = strings.ToLower(reason)
	for _, r := range s.Reasons {
		if strings.Contains(reason, strings.ToLower(r)) {
			return true
		}
	}
	return false
}

// Sizes of the bad values: 300 bytes is over AMQP's 255-byte short
// strings; 1500 bytes is over every id bound (publish 200, inbound 1024).
const (
	PoisonShortStringLen = 300
	PoisonLongIDLen      = 1500
)

var poisonSpecs = []PoisonSpec{
	{Class: PoisonErrPlain, Terminal: TerminalDeadLetter, Endpoints: 2, Reasons: []string{"poison err-plain: charge declined"}},
	{Class: PoisonErrDeadline, Terminal: TerminalDeadLetter, Endpoints: 2, Reasons: []string{"poison err-deadline: charge: context deadline exceeded"}},
	{Class: PoisonErrURL, Terminal: TerminalDeadLetter, Endpoints: 2, Reasons: []string{"poison err-url: charge: post"}},
	{Class: PoisonPermPlain, Terminal: TerminalDeadLetter, Endpoints: 2, Permanent: true, Reasons: []string{"poison perm-plain: charge declined"}},
	{Class: PoisonPermDeadline, Terminal: TerminalDeadLetter, Endpoints: 2, Permanent: true, Reasons: []string{"poison perm-deadline: charge: context deadline exceeded"}},
	{Class: PoisonPermURL, Terminal: TerminalDeadLetter, Endpoints: 2, Permanent: true, Reasons: []string{"poison perm-url: charge: post"}},
	{Class: PoisonPanic, Terminal: TerminalDeadLetter, Endpoints: 2, Reasons: []string{"consumer panicked"}},
	// 25P02: in_failed_sql_transaction.
	{Class: PoisonAbortedTx, Terminal: TerminalDeadLetter, Endpoints: 2, Reasons: []string{"25P02", "transaction is aborted"}},
	{Class: PoisonBadJSON, Terminal: TerminalDeadLetter, Endpoints: 2, Permanent: true, Reasons: []string{"invalid character", "decod", "unmarshal"}},
	{Class: PoisonUnknownType, Terminal: TerminalDeadLetter, Endpoints: 1, Permanent: true, Reasons: []string{"no consumer for message type"}},

	{Class: PoisonPubLongCorrelation, Terminal: TerminalRefused},
	{Class: PoisonPubLongHeaderKey, Terminal: TerminalRefused},
	{Class: PoisonPubLongID, Terminal: TerminalRefused},
	{Class: PoisonPubNULID, Terminal: TerminalRefused},
	{Class: PoisonPubBadUTF8ID, Terminal: TerminalRefused},
	{Class: PoisonSendMissingQueue, Terminal: TerminalRefusedOrParked},

	{Class: PoisonRawLongID, Terminal: TerminalDeadLetter, Endpoints: 1, Permanent: true, RabbitMQOnly: true, Reasons: []string{"message id"}},
	{Class: PoisonRawNULID, Terminal: TerminalDeadLetter, Endpoints: 1, Permanent: true, RabbitMQOnly: true, Reasons: []string{"message id"}},
	{Class: PoisonRawBadUTF8ID, Terminal: TerminalDeadLetter, Endpoints: 1, Permanent: true, RabbitMQOnly: true, Reasons: []string{"message id"}},
}

// PoisonClasses lists the classes sent on transport ("rabbitmq" or
// "postgres"): the raw AMQP classes only on RabbitMQ.
func PoisonClasses(transport string) []PoisonSpec {
	var out []PoisonSpec
	for _, s := range poisonSpecs {
		if s.RabbitMQOnly && transport != "rabbitmq" {
			continue
		}
		out = append(out, s)
	}
	return out
}

// PoisonSpecOf returns the spec of class c.
func PoisonSpecOf(c PoisonClass) (PoisonSpec, bool) {
	for _, s := range poisonSpecs {
		if s.Class == c {
			return s, true
		}
	}
	return PoisonSpec{}, false
}

// MissingQueue is the queue the send-missing-queue class sends to: no
// endpoint declares it.
func (n Names) MissingQueue() string { return n.Run + "-no-such-queue" }

// UnknownType is the message type of the unknown-type class: no consumer
// registers it.
func (n Names) UnknownType() string { return n.Run + ".NobodyConsumesThis" }
