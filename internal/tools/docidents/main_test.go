package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fixture is a small module: its packages and its Markdown files.
var fixture = map[string]string{
	"go.mod": "module example.com/fake\n\ngo 1.26\n",
	"bus/bus.go": `package bus

import (
	"errors"

	"example.com/fake/endpoint"
)

type Bus struct {
	Name string
	Options
}

type Options struct {
	Timeout int
	Queue   endpoint.Queue
}

func New(opts ...func(*Options)) *Bus { return &Bus{} }

func (b *Bus) Stop() error { return nil }

const HeaderDestination = "BW-Destination"

var ErrClosed = errors.New("closed")

var Default = New()
`,
	"bus/only_integration.go": `//go:build integration

package bus

func Integration() {}
`,
	"bus/bus_test.go": "package bus\n\nfunc TestOnly() {}\n",
	"endpoint/endpoint.go": `package endpoint

type Context[T any] struct {
	Message T
}

func (c *Context[T]) Reply(msg any) error { return nil }

type Endpoints struct{}

func (e *Endpoints) ReceiveEndpoint(name string) {}

func Consumer[T any](e *Endpoints, fn func(*Context[T]) error) {}

type Queue struct {
	Type QueueType
}

type QueueType string

func (t QueueType) Valid() bool { return t != "" }

type Acker interface {
	Nack() error
}

type Delivery interface {
	Acker
	Ack() error
}
`,
	"transport/inproc/inproc.go": `package inproc

import (
	"gorm.io/gorm"

	ep "example.com/fake/endpoint"
)

type Config struct {
	ep.Endpoints
	Workers int
}

type External struct {
	*gorm.DB
}

type Alias = Config
`,
	"a/util/util.go":             "package util\n\nfunc A() {}\n",
	"b/util/util.go":             "package util\n\nfunc B() {}\n",
	"cmd/tool/main.go":           "package main\n\nfunc Hidden() {}\n\nfunc main() {}\n",
	"testdata/bus/bus.go":        "package bus\n\nfunc FromTestdata() {}\n",
	"nested/go.mod":              "module example.com/nested\n",
	"nested/bus/bus.go":          "package bus\n\nfunc FromNested() {}\n",
	"CHANGELOG.md":               "Removed `bus.Gone`.\n",
	"docs/page.md":               "# Page\n\nSee `bus.Absent`.\n",
	"samples/demo/README.md":     "Uses `bus.New` and `bus.Sample`.\n",
	"examples/minimal/README.md": "Uses `endpoint.Example`.\n",
}

// readme is the fixture's README.md; a line ending in "MISS: reason" must
// be reported with that reason, every other line must not.
const readme = "# Fake\n" +
	"\n" +
	"Start with `bus.New()` or `bus.New(func(o *bus.Options) { o.Timeout = 1 })` and stop with\n" +
	"`(*bus.Bus).Stop`, `bus.Bus.Stop`, `*bus.Bus` or `bus.New().Stop`; `bus.Default.Stop` too.\n" +
	"Generics: `endpoint.Context[T]`, `*endpoint.Context[T]`, `endpoint.Context[T].Reply`,\n" +
	"`endpoint.Context[T].Message`, `endpoint.Consumer[T](e, fn)`, `endpoint.Consumer`.\n" +
	"Promoted: `bus.Bus.Timeout`, `bus.Bus.Options`, `inproc.Config.ReceiveEndpoint`, `inproc.Alias.Workers`.\n" +
	"Chains: `bus.Options.Queue.Type`, `bus.Bus.Queue.Type.Valid`, `endpoint.Delivery.Nack`, `endpoint.Delivery.Ack`.\n" +
	"Values: `bus.HeaderDestination`, `bus.ErrClosed`, `bus.ErrClosed.Error`, `[]bus.Options`, `&bus.Options{Timeout: 1}`.\n" +
	"Build tags: `bus.Integration`. Paths: `transport/inproc.Config`, `example.com/fake/bus.New`.\n" +
	"Another module's embedded type: `inproc.External.Exec`. Shared names: `util.A`, `util.B`.\n" +
	"Not checked: `time.Second`, `amqp.Table`, `gorm.DB`, `b.Stop`, `bus/bus.go`, `bus.go`, `New`,\n" +
	"`Options.Nope`, `BW-MessageType`, `go run ./cmd/tool`, `SELECT 1`, `main.Hidden`, `main.Nope`, `--flag`,\n" +
	"`BAREWIRE_TEST_AMQP_URL`, `b := bus.Nope()`, \\`bus.Escaped\\`, ```bus.New``` and `` `x` ``.\n" +
	"\n" +
	"Missing: `bus.Publish`. MISS: package bus has no Publish\n" +
	"Missing field: `bus.Options.Retries`. MISS: type Options has no field or method Retries\n" +
	"Missing promoted: `inproc.Config.Nope`. MISS: type Config has no field or method Nope\n" +
	"Missing method of a generic: `endpoint.Context[T].Ack()`. MISS: type Context has no field or method Ack\n" +
	"Missing deep: `bus.Bus.Queue.Kind`. MISS: type Queue has no field or method Kind\n" +
	"Missing pointer method: `(*bus.Bus).Close`. MISS: type Bus has no field or method Close\n" +
	"Not in testdata or nested modules or tests: `bus.FromTestdata`. MISS: package bus has no FromTestdata\n" +
	"`bus.FromNested`. MISS: package bus has no FromNested\n" +
	"`bus.TestOnly`. MISS: package bus has no TestOnly\n" +
	"Shared name, neither has it: `util.C`. MISS: package util has no C\n" +
	"Double backticks: ``bus.Double``. MISS: package bus has no Double\n" +
	"A span over two lines: `bus.Options.Timeout\n" +
	"` and `bus.Bus.Stop`. `bus.\n" +
	"Split` is not one name.\n" +
	"\n" +
	"There is no `bus.Foo` <!-- docidents: ignore -->\n" +
	"and `bus.Bar` on the next line is checked. MISS: package bus has no Bar\n" +
	"<!-- docidents: ignore -->\n" +
	"nor `bus.Baz`, `bus.Qux`.\n" +
	"\n" +
	"```go\n" +
	"x := `bus.InFence`\n" +
	"```\n" +
	"\n" +
	"~~~~\n" +
	"`bus.InTildeFence`\n" +
	"```\n" +
	"`bus.StillInTildeFence`\n" +
	"~~~~\n" +
	"\n" +
	"- a list item\n" +
	"\n" +
	"  ```\n" +
	"  `bus.InIndentedFence`\n" +
	"  ```\n" +
	"\n" +
	"After the fences: `bus.AfterFence`. MISS: package bus has no AfterFence\n" +
	"- an item with a lone ` backtick\n" +
	"- an item: `bus.InList`. MISS: package bus has no InList\n" +
	"\n" +
	"| a row with a lone ` backtick |\n" +
	"| a row: `bus.InTable` | MISS: package bus has no InTable\n"

func writeFixture(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{"README.md": readme}
	for name, body := range fixture {
		files[name] = body
	}
	for name, body := range files {
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestFixture(t *testing.T) {
	root := writeFixture(t)
	var stdout, stderr bytes.Buffer
	code := run(root, false, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit code = %d; want 1", code)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout without -v = %q; want nothing", stdout.String())
	}

	var want []string
	for i, line := range strings.Split(readme, "\n") {
		_, reason, ok := strings.Cut(line, " MISS: ")
		if !ok {
			continue
		}
		start := strings.Index(line, "`")
		n := len(line[start:]) - len(strings.TrimLeft(line[start:], "`"))
		end := strings.Index(line[start+n:], strings.Repeat("`", n)) + start + n
		text := strings.TrimSpace(line[start+n : end])
		want = append(want, fmt.Sprintf("README.md:%d: `%s`: %s", i+1, text, reason))
	}
	want = append(want,
		"docs/page.md:3: `bus.Absent`: package bus has no Absent",
		"samples/demo/README.md:1: `bus.Sample`: package bus has no Sample",
		"examples/minimal/README.md:1: `endpoint.Example`: package endpoint has no Example",
	)
	got := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("misses:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestVerbose(t *testing.T) {
	root := t.TempDir()
	for name, body := range map[string]string{
		"go.mod":     "module example.com/clean\n",
		"bus/bus.go": "package bus\n\nfunc New() {}\n",
		"README.md":  "`bus.New` and `bus.New()`;\nno `bus.Gone` <!-- docidents: ignore -->\n",
	} {
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(root, false, &stdout, &stderr); code != 0 || stdout.Len()+stderr.Len() != 0 {
		t.Fatalf("clean run: code %d, stdout %q, stderr %q; want 0 and silence", code, stdout.String(), stderr.String())
	}
	if code := run(root, true, &stdout, &stderr); code != 0 {
		t.Fatalf("-v: code %d, stderr %q", code, stderr.String())
	}
	want := "docidents: 2 identifier(s) checked in 1 file(s) against 1 package(s); 0 miss(es), 1 ignored by comment\n"
	if stdout.String() != want {
		t.Errorf("-v printed %q; want %q", stdout.String(), want)
	}
}

// TestThisModule resolves a few names against this repository's packages,
// which the fixture imitates.
func TestThisModule(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Skip("not inside the module:", err)
	}
	mod, err := loadModule(root)
	if err != nil {
		t.Fatal(err)
	}
	for span, want := range map[string]string{
		"bus.New":                                 "",
		"(*bus.Bus).Stop":                         "",
		"bus.WithOutbox(...)":                     "",
		"endpoint.Context[T]":                     "",
		"endpoint.Consumer[T](e, fn)":             "",
		"outbox.Options.PublishThroughOutbox":     "",
		"bus.NoSuchName":                          "package bus has no NoSuchName",
		"outbox.Options.NoSuchField":              "type Options has no field or method NoSuchField",
		"transport/inproc.Config.ReceiveEndpoint": "",
	} {
		r, ok := mod.parseRef(span)
		if !ok {
			t.Errorf("%s: not recognised as a name of this module", span)
			continue
		}
		if got := mod.check(r); got != want {
			t.Errorf("%s: got %q; want %q", span, got, want)
		}
	}
	for _, span := range []string{"b.Stop", "time.Second", "bus/bus.go", "BW-MessageType", "main.main"} {
		if _, ok := mod.parseRef(span); ok {
			t.Errorf("%s: checked; want ignored", span)
		}
	}
}
