package rabbitmq

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
)

func TestSplitURLs(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"amqp://h1/", []string{"amqp://h1/"}},
		{"amqp://u:p@h1:5681/,amqp://u:p@h2:5682/", []string{"amqp://u:p@h1:5681/", "amqp://u:p@h2:5682/"}},
		{" amqp://h1/ , AMQPS://h2/ ,amqp://h3", []string{"amqp://h1/", "AMQPS://h2/", "amqp://h3"}},
		// A comma in a password is not a separator: no scheme follows it.
		{"amqp://u:a,b@h1/,amqp://u:c,d@h2/", []string{"amqp://u:a,b@h1/", "amqp://u:c,d@h2/"}},
		{"amqp://h1/,", []string{"amqp://h1/,"}},
	}
	for _, c := range cases {
		if got := splitURLs(c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("splitURLs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseAddresses(t *testing.T) {
	const pw = "s3cret-pw"
	a, err := parseAddresses("amqp://u:"+pw+"@h1:5681/,amqp://u:"+pw+"@h2:5682/", []string{"amqps://v:" + pw + "@h3:5683/vh"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"amqp://u:xxxxx@h1:5681/", "amqp://u:xxxxx@h2:5682/", "amqps://v:xxxxx@h3:5683/vh"}
	if got := a.redacted(); !reflect.DeepEqual(got, want) {
		t.Errorf("redacted = %q, want %q", got, want)
	}
	if len(a.urls) != 3 || a.urls[2] != "amqps://v:"+pw+"@h3:5683/vh" {
		t.Errorf("urls = %d %q", len(a.urls), a.urls)
	}
	// Every address's password is scrubbed from any text.
	text := "dial amqps://v:" + pw + "@h3:5683/vh failed; v:" + pw + " refused"
	if got := a.all.scrub(text); strings.Contains(got, pw) {
		t.Errorf("scrub left the password: %q", got)
	}

	// Only Config.URLs: New's url may be empty then.
	if a, err := parseAddresses("", []string{"amqp://h1/", "amqp://h2/"}); err != nil || len(a.urls) != 2 {
		t.Errorf("URLs alone: %v %v", a.urls, err)
	}

	// Every bad address is reported, by position, without its password.
	_, err = parseAddresses("amqp://u:"+pw+"@h1/,amqp://u:"+pw+"@:5/", []string{"http://u:" + pw + "@h3/", "amqp://u:" + pw + "@h1/"})
	if err == nil {
		t.Fatal("bad addresses accepted")
	}
	msg := err.Error()
	t.Log(msg)
	if strings.Contains(msg, pw) {
		t.Errorf("error leaks the password: %v", msg)
	}
	for _, want := range []string{"address 2 of 4", "no host", "address 3 of 4", "scheme", "address 4", "repeats address 1"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %v", want, msg)
		}
	}
	if _, err := parseAddresses("", nil); err == nil {
		t.Error("no address accepted")
	}
}

func TestFailoverOrder(t *testing.T) {
	a, err := parseAddresses("amqp://h1/,amqp://h2/,amqp://h3/", nil)
	if err != nil {
		t.Fatal(err)
	}
	for start, want := range [][]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}} {
		if got := a.order(start); !reflect.DeepEqual(got, want) {
			t.Errorf("order(%d) = %v, want %v", start, got, want)
		}
	}
}

func TestDialErrors(t *testing.T) {
	one := &dialErrors{addrs: []string{"amqp://u:xxxxx@h1/"}, errs: []error{errors.New("connection refused")}}
	if one.Error() != "connection refused" {
		t.Errorf("one address: %q", one.Error())
	}
	refused := &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"}
	e := &dialErrors{addrs: []string{"amqp://u:xxxxx@h1/", "amqp://u:xxxxx@h2/"}, errs: []error{errors.New("connection refused"), refused}}
	msg := e.Error()
	for _, want := range []string{"2 addresses tried", "amqp://u:xxxxx@h1/: connection refused", "amqp://u:xxxxx@h2/: Exception (403)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
	var aerr *amqp.Error
	if !errors.As(e, &aerr) {
		t.Error("errors.As does not reach an address's *amqp.Error")
	}
	if e.hopeless() {
		t.Error("hopeless although one node only refused the connection (it may come back)")
	}
	if !(&dialErrors{addrs: []string{"a", "b"}, errs: []error{refused, refused}}).hopeless() {
		t.Error("not hopeless although every node refused the credentials")
	}
}

func TestQueueTypeConfig(t *testing.T) {
	for _, typ := range []endpoint.QueueType{endpoint.Stream, "bogus"} {
		c := Config{QueueType: typ}
		if errs := c.check(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "QueueType") {
			t.Errorf("QueueType %q: %v", typ, errs)
		}
	}
	for _, typ := range []endpoint.QueueType{"", endpoint.Classic, endpoint.Quorum} {
		c := Config{QueueType: typ}
		if errs := c.check(); len(errs) != 0 {
			t.Errorf("QueueType %q refused: %v", typ, errs)
		}
	}
}

func TestEndpointQueueArgs(t *testing.T) {
	build := func(cfg Config, configure func(e *endpoint.Endpoint)) (*Transport, *endpoint.Endpoint) {
		tr := &Transport{cfg: cfg.withDefaults(0)}
		return tr, newEndpoint(t, "orders", nil, configure)
	}
	// Classic by default: nothing added, no x-queue-type.
	tr, ep := build(Config{}, nil)
	if q := tr.endpointQueue(ep); q.Type != "" || len(q.Args) != 0 {
		t.Errorf("default: %+v", q)
	}
	if q := tr.errorQueue(ep); q.Type != "" {
		t.Errorf("default error queue: %+v", q)
	}
	// Config.QueueType quorum: the endpoint and error queues, with the
	// delivery limit and at-least-once dead-lettering into the error queue.
	tr, ep = build(Config{QueueType: endpoint.Quorum}, nil)
	q := tr.endpointQueue(ep)
	want := map[string]any{"x-delivery-limit": int64(20), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders_error",
		"x-overflow": "reject-publish", "x-dead-letter-strategy": "at-least-once"}
	if q.Type != endpoint.Quorum || !reflect.DeepEqual(q.Args, want) {
		t.Errorf("quorum: %+v", q)
	}
	if eq := tr.errorQueue(ep); eq.Type != endpoint.Quorum || len(eq.Args) != 0 {
		t.Errorf("quorum error queue: %+v", eq)
	}
	if got := queueArgs(q); got["x-queue-type"] != "quorum" || got["x-dead-letter-exchange"] != "" {
		t.Errorf("declared arguments: %v", got)
	}
	// What the endpoint sets wins.
	tr, ep = build(Config{QueueType: endpoint.Quorum, DeliveryLimit: 5}, func(e *endpoint.Endpoint) {
		e.Queue.Args = map[string]any{"x-delivery-limit": 3}
		e.Queue.DeadLetterExchange = "dlx"
		e.Queue.Overflow = "drop-head"
	})
	q = tr.endpointQueue(ep)
	if q.Args["x-delivery-limit"] != 3 || q.Args["x-dead-letter-exchange"] != nil || q.Args["x-dead-letter-strategy"] != nil || q.Args["x-overflow"] != nil {
		t.Errorf("endpoint settings: %+v", q.Args)
	}
	if got := queueArgs(q); got["x-dead-letter-exchange"] != "dlx" || got["x-overflow"] != "drop-head" {
		t.Errorf("endpoint settings declared as %v", got)
	}
	if ep.Queue.Args["x-dead-letter-strategy"] != nil || len(ep.Queue.Args) != 1 {
		t.Errorf("the endpoint's own Args were modified: %v", ep.Queue.Args)
	}
	// A stream endpoint stays a stream; its error queue is classic.
	tr, ep = build(Config{QueueType: endpoint.Quorum}, func(e *endpoint.Endpoint) { e.Queue.Type = endpoint.Stream })
	if q := tr.endpointQueue(ep); q.Type != endpoint.Stream || len(q.Args) != 0 {
		t.Errorf("stream: %+v", q)
	}
	if eq := tr.errorQueue(ep); eq.Type != endpoint.Classic {
		t.Errorf("stream error queue: %+v", eq)
	}
	// DeliveryLimit < 0: quorum, bare.
	tr, ep = build(Config{QueueType: endpoint.Quorum, DeliveryLimit: -1}, nil)
	if q := tr.endpointQueue(ep); q.Type != endpoint.Quorum || len(q.Args) != 0 {
		t.Errorf("bare quorum: %+v", q)
	}
}
