package main

import (
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// utime 250 and stime 50 ticks: 3 s.
	line := "4242 (postgres) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 1 0 100 200000000 5000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n"
	comm, cpu, ok := parseProcStat(line)
	if !ok || comm != "postgres" || cpu != 3*time.Second {
		t.Fatalf("parseProcStat = %q, %v, %v; want postgres, 3s, true", comm, cpu, ok)
	}
	// A command name with spaces and a parenthesis is not a server's.
	if comm, _, ok := parseProcStat("7 (a (b) c) S 1 2 3 0 -1 0 0 0 0 0 9 9 0 0 20 0 1 0 1 1 1\n"); ok || comm != "a (b) c" {
		t.Fatalf("parseProcStat of another process = %q, ok %v; want its name and false", comm, ok)
	}
	if _, _, ok := parseProcStat("garbage"); ok {
		t.Fatal("parseProcStat accepted garbage")
	}
	// This process is neither: readServerCPU must not count it.
	s := readServerCPU()
	for pid := range s.pg {
		if pid <= 0 {
			t.Fatalf("bad pid %d", pid)
		}
	}
	later := readServerCPU()
	if pg, rabbit := later.since(s); pg < 0 || rabbit < 0 {
		t.Fatalf("negative server CPU: %v, %v", pg, rabbit)
	}
}
