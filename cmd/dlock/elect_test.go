package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// The tests of dlock run --elect against real servers, with several
// candidates in several processes, are in tests/dlockcmd (the development
// module).

// TestElectFlagsBeforeIO: the flags that make no sense with --elect
// (--try, --wait, --max-hold, --permits, --shared), a bad --holder (with
// or without --elect) and a bad --permits are usage errors (status 2) found before any I/O: the backend's
// server does not exist and is never named, and the command, which does
// not exist either, is not looked for (that would be status 127).
func TestElectFlagsBeforeIO(t *testing.T) {
	for _, c := range []struct {
		flags []string
		msg   string
	}{
		{[]string{"--elect", "--try"}, "--elect and --try exclude each other"},
		{[]string{"--elect", "--wait", "1s"}, "--elect and --wait exclude each other"},
		{[]string{"--elect", "--wait", "0"}, "--elect and --wait exclude each other"},
		{[]string{"--elect", "--max-hold", "1h"}, "--elect and --max-hold exclude each other"},
		{[]string{"--max-hold", "0", "--elect"}, "--elect and --max-hold exclude each other"},
		{[]string{"--elect", "--holder", "web-3\x1b[2J"}, `--holder "web-3\x1b[2J": invalid configuration: holder: character U+001B at byte 5 is not printable`},
		{[]string{"--holder", "web-3\n4242"}, `--holder "web-3\n4242": invalid configuration: holder: character U+000A at byte 5 is not printable`},
		{[]string{"--elect", "--holder", strings.Repeat("h", backend.MaxHolderLen+1)}, "holder: 257 bytes, longer than 256"},
		{[]string{"--holder", "bad\xffutf8"}, "holder: not valid UTF-8"},
		{[]string{"--elect", "--permits", "2"}, "--elect and --permits exclude each other"},
		{[]string{"--elect", "--shared"}, "--elect and --shared exclude each other"},
		{[]string{"--permits", "0"}, "--permits 0: want a number of permits >= 1"},
		{[]string{"--permits", "-3"}, "--permits -3: want a number of permits >= 1"},
		{[]string{"--permits", "2", "--shared"}, "--shared and --permits exclude each other"},
	} {
		args := append(append([]string{"run", "--url", "etcd://127.0.0.1:1"}, c.flags...), "k", "--", "dlock-no-such-command")
		var o, e bytes.Buffer
		start := time.Now()
		code := dispatch(t.Context(), &env{stdout: &o, stderr: &e, getenv: func(string) string { return "" }}, args)
		stderr := e.String()
		if code != exitUsage || o.Len() != 0 || !strings.HasPrefix(stderr, "dlock run: ") || !strings.Contains(stderr, c.msg) ||
			strings.Contains(stderr, "127.0.0.1") || strings.Contains(stderr, "not found") ||
			!strings.HasSuffix(stderr, "Run 'dlock run -h' for usage.\n") {
			t.Errorf("dlock %q: status %d, stdout %q, stderr %q; want 2 and a usage error with %q", args, code, o.String(), stderr, c.msg)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("dlock %q took %v: it tried the backend", args, el)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes: dlock's own
// messages and the command's output (copied by os/exec) go to the same
// stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// electInProcess runs dlock run --elect ARGS in this process on the
// in-process store mem://NAME (its own), until ctx ends; it returns the
// exit status on the channel.
func electInProcess(ctx context.Context, t *testing.T, store string, args ...string) (stderr *syncBuffer, status <-chan int) {
	t.Helper()
	stderr = &syncBuffer{}
	ch := make(chan int, 1)
	go func() {
		e := &env{stdout: stderr, stderr: stderr, getenv: func(string) string { return "" }}
		ch <- dispatch(ctx, e, append([]string{"run", "--elect", "--url", "mem://" + store}, args...))
	}()
	return stderr, ch
}

// waitLines waits (up to 30 s) for path to hold n lines, and returns them.
func waitLines(t *testing.T, path string, n int, stderr *syncBuffer) []string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(path)
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(b) > 0 && len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %q after 30s, want %d lines; dlock's stderr:\n%s", path, b, n, stderr.String())
		}
	}
}

// assertFree checks that key is free on mem://store: dlock gave the lease
// back.
func assertFree(t *testing.T, store, key string) {
	t.Helper()
	l, err := dlock.Open(t.Context(), "mem://"+store)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if info, err := l.Inspect(t.Context(), key); err != nil || info.Held {
		t.Errorf("after dlock run --elect: %s is %+v (%v), want free", key, info, err)
	}
}

// TestElectCommandExitNewTerm: each time the command exits by itself,
// with status 0 or not, dlock gives leadership up and is elected again
// with a larger term (DLOCK_TOKEN), DLOCK_KEY and DLOCK_DEADLINE set as
// dlock run sets them; the end of dlock's context (as a signal does) ends
// it with status 0 and the lease given back. On mem://, no server.
func TestElectCommandExitNewTerm(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stderr, status := electInProcess(ctx, t, "elect-exit", "--ttl", "5s", "k", "--", "sh", "-c",
		`echo "$DLOCK_TOKEN $DLOCK_KEY $DLOCK_DEADLINE" >> "$0"; exit $(( DLOCK_TOKEN % 2 * 3 ))`, log)
	lines := waitLines(t, log, 3, stderr)
	cancel()
	if code := <-status; code != exitOK {
		t.Errorf("status %d after the context ended, want 0; stderr:\n%s", code, stderr.String())
	}
	var last uint64
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) != 3 || f[1] != "k" {
			t.Fatalf("the command's log %q: want DLOCK_TOKEN, DLOCK_KEY k and DLOCK_DEADLINE on each line", lines)
		}
		tok, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || tok <= last {
			t.Errorf("the command's log %q: terms not increasing", lines)
		}
		last = tok
		if _, err := time.Parse(time.RFC3339, f[2]); err != nil {
			t.Errorf("DLOCK_DEADLINE %q: %v", f[2], err)
		}
	}
	out := stderr.String()
	for _, want := range []string{"dlock run: leading k (term 1): starting the command\n",
		"dlock run: the command ended (exit status 3) in term 1: leadership of k given up; campaigning again\n",
		"dlock run: the command ended (exit status 0) in term 2: leadership of k given up; campaigning again\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr %q: want %q", out, want)
		}
	}
	assertFree(t, "elect-exit", "k")
}

// TestElectStopsCommand: when dlock's campaign ends (a signal; here its
// context), the running command is sent SIGTERM, then SIGKILL after
// --grace if it ignores it; dlock exits 0 and gives the lease back.
func TestElectStopsCommand(t *testing.T) {
	for _, c := range []struct{ name, trap, want string }{
		{"SIGTERM", `trap 'echo stopped by TERM >> "$0"; exit 0' TERM`, "stopped by TERM"},
		{"SIGKILL after grace", `trap 'echo TERM ignored >> "$0"' TERM`, "TERM ignored"},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := "elect-stop-" + strconv.Itoa(len(c.name))
			log := filepath.Join(t.TempDir(), "log")
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			stderr, status := electInProcess(ctx, t, store, "--grace", "1s", "k", "--", "sh", "-c",
				c.trap+`; echo started >> "$0"; while :; do sleep 0.1; done`, log)
			waitLines(t, log, 1, stderr)
			start := time.Now()
			cancel()
			if code := <-status; code != exitOK {
				t.Errorf("status %d, want 0; stderr:\n%s", code, stderr.String())
			}
			if el := time.Since(start); el > 20*time.Second {
				t.Errorf("dlock took %v to stop the command (--grace 1s)", el)
			}
			b, _ := os.ReadFile(log)
			if !strings.Contains(string(b), c.want) {
				t.Errorf("the command's log %q: want %q", b, c.want)
			}
			if !strings.Contains(stderr.String(), "stopping the command (SIGTERM, SIGKILL after 1s)") {
				t.Errorf("stderr %q: want the stop reported", stderr.String())
			}
			assertFree(t, store, "k")
		})
	}
}

// TestElectStartFails: a command that is found but cannot be started when
// dlock is elected (here: not an executable format) ends dlock with
// status 126, the lease given back, instead of a campaign that fails on
// every term.
func TestElectStartFails(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "not-a-program")
	if err := os.WriteFile(bad, []byte{0x7f, 'E', 'L', 'F', 0, 0, 0, 0}, 0o755); err != nil {
		t.Fatal(err)
	}
	stderr, status := electInProcess(t.Context(), t, "elect-start", "k", "--", bad)
	select {
	case code := <-status:
		if code != exitCannotRun || !strings.Contains(stderr.String(), "exec format error") {
			t.Errorf("status %d, stderr %q; want 126 and the exec error", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("dlock run --elect still runs after 30s; stderr:\n%s", stderr.String())
	}
	assertFree(t, "elect-start", "k")
}

// TestDefaultHolder: hostname/pid, a valid holder description.
func TestDefaultHolder(t *testing.T) {
	h := defaultHolder()
	if !strings.HasSuffix(h, "/"+strconv.Itoa(os.Getpid())) || len(h) < 3 || backend.ValidateHolder(h) != nil || !utf8.ValidString(h) {
		t.Errorf("defaultHolder() = %q, want hostname/%d, valid", h, os.Getpid())
	}
}
