package detach

import (
	"context"
	"testing"
	"time"
)

type key struct{}

// TestFromOutlivesCancellationKeepsValuesAndEnds: the detached context is
// not canceled with its parent, carries the parent's values, and has a
// deadline Timeout from now, so a detached step never waits for ever.
func TestFromOutlivesCancellationKeepsValuesAndEnds(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	cancelParent()
	before := time.Now()
	ctx, cancel := From(parent)
	defer cancel()
	if err := ctx.Err(); err != nil {
		t.Fatalf("detached from a canceled parent: %v; want it live", err)
	}
	if v := ctx.Value(key{}); v != "v" {
		t.Fatalf("value %v; want the parent's", v)
	}
	d, ok := ctx.Deadline()
	if !ok {
		t.Fatal("no deadline: a detached step could wait for ever")
	}
	if got := d.Sub(before); got < Timeout || got > Timeout+time.Second {
		t.Fatalf("deadline %v from now; want Timeout (%v)", got, Timeout)
	}
	cancel()
	if ctx.Err() == nil {
		t.Fatal("cancel did not end the detached context")
	}
}
