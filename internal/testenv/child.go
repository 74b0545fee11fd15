package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// ChildReady is the line a child process prints when it has done what
// KillChildWhenReady waits for.
const ChildReady = "ready"

// KillChildWhenReady runs this test binary again as a child process with
// env added to the environment (no test runs in it: the package's
// TestMain must recognise one of env's variables and run the child's part
// instead), waits until the child prints ChildReady on a line of its own,
// then kills it with SIGKILL and waits for it to end. A child that exits or
// prints anything else first fails the test.
func KillChildWhenReady(t testing.TB, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != ChildReady+"\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child said %q, %v; want %q", line, err, ChildReady)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// SignalReadyAndWait is the end of a child's part: it prints ChildReady and
// blocks until the parent kills the process.
func SignalReadyAndWait() {
	fmt.Println(ChildReady)
	select {}
}
