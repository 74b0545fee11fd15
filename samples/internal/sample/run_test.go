package sample_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

func quietBus(t *testing.T) *bus.Bus {
	t.Helper()
	b, err := bus.New(bus.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRunDemo: with -demo, Run starts the bus, runs the demo on a started
// bus and returns its error prefixed "demo: ".
func TestRunDemo(t *testing.T) {
	f := sample.Flags{Demo: true}
	ran := false
	err := f.Run(quietBus(t), http.NewServeMux(), func(ctx context.Context) error {
		ran = true
		return nil
	}, 0)
	if err != nil || !ran {
		t.Fatalf("Run = %v, ran %v; want the demo run, no error", err, ran)
	}
	boom := errors.New("boom")
	err = f.Run(quietBus(t), http.NewServeMux(), func(context.Context) error { return boom }, time.Second)
	if !errors.Is(err, boom) || err.Error() != "demo: boom" {
		t.Fatalf("Run = %v; want demo: boom", err)
	}
}

// TestRunServesStats: without -demo, Run serves mux with GET /stats added
// (the bus's Stats as JSON) and the health routes, until SIGINT.
func TestRunServesStats(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	f := sample.Flags{Listen: addr}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hi") })
	done := make(chan error, 1)
	go func() { done <- f.Run(quietBus(t), mux, nil, 0) }()
	var resp *http.Response
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err = http.Get("http://" + addr + "/stats")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the listener has no readiness signal
	}
	if err != nil {
		t.Fatal(err)
	}
	var st bus.Stats
	decErr := json.NewDecoder(resp.Body).Decode(&st)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || decErr != nil {
		t.Fatalf("GET /stats: %d, %v", resp.StatusCode, decErr)
	}
	for _, path := range []string{"/hello", "/health"} {
		r, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", path, r.StatusCode)
		}
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after SIGINT = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after SIGINT")
	}
}
