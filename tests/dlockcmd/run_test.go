package dlockcmd_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// runProc is a `dlock run` started from the built binary.
type runProc struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	code           int
}

// startRun starts the built dlock with args and the extra environment env.
func startRun(t *testing.T, env []string, stdin string, args ...string) *runProc {
	t.Helper()
	p := &runProc{cmd: exec.Command(dlockBinary(t), args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdin = strings.NewReader(stdin)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	// Its own process group, so that the clean-up ends the command too,
	// and Wait does not wait for a command that keeps the pipes open.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.code = -int(ws.Signal()) // dlock itself killed: no status of its own
			}
		default:
			p.code = -1000
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // dlock and what it started
		<-p.done
	})
	return p
}

// wait waits (up to 60 s) for dlock to exit and returns its status.
func (p *runProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		t.Fatalf("dlock %q did not exit within 60s; stderr:\n%s", p.cmd.Args[1:], p.stderr.String())
		return 0
	}
}

// runDlock runs the built dlock to its end.
func runDlock(t *testing.T, env []string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	p := startRun(t, env, stdin, args...)
	code = p.wait(t)
	return p.stdout.String(), p.stderr.String(), code
}

// runWaitFile polls until path exists with content containing want.
func runWaitFile(t *testing.T, p *runProc, path, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("dlock exited (status %d) before %s had %q; stderr:\n%s", p.code, path, want, p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %q after 30s, want %q; dlock's stderr:\n%s", path, b, want, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func runRedisURL(t *testing.T) string { return "redis://" + servers.Redis(t, 1)[0].Addr() }

func runEtcdURL(t *testing.T) string {
	return "etcd://" + strings.Join(servers.Etcd(t, 1).Endpoints(), ",")
}

// runKey is a lock key of the test's own.
func runKey(t *testing.T) string {
	return fmt.Sprintf("dlock-run-test/%s/%d", t.Name(), time.Now().UnixNano())
}

// runAssertFree checks that key can be taken at once (dlock released it), and
// returns the token of that grant.
func runAssertFree(t *testing.T, url, key string) dlock.Token {
	t.Helper()
	l := openTest(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	le, err := l.TryAcquire(ctx, key, nil)
	if err != nil {
		t.Fatalf("the lock %s is not free after dlock run: %v", key, err)
	}
	defer le.Release(ctx)
	return le.Token()
}

func TestRunExitStatus(t *testing.T) {
	url := runRedisURL(t)
	for _, tc := range []struct {
		name   string
		script string
		want   int
	}{
		{"zero", "exit 0", 0},
		{"three", "exit 3", 3},
		{"signal", "kill -TERM $$", 128 + int(syscall.SIGTERM)},
		{"kill", "kill -KILL $$", 128 + int(syscall.SIGKILL)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := runKey(t)
			_, stderr, code := runDlock(t, nil, "", "run", "--url", url, key, "--", "sh", "-c", tc.script)
			if code != tc.want {
				t.Fatalf("exit status %d, want %d; stderr:\n%s", code, tc.want, stderr)
			}
			runAssertFree(t, url, key)
		})
	}
}

func TestRunEnvAndStdio(t *testing.T) {
	url := runRedisURL(t)
	key := runKey(t)
	start := time.Now()
	stdout, stderr, code := runDlock(t, []string{"DLOCK_URL=" + url, "DLOCK_TOKEN=stale"}, "from stdin\n",
		"run", "--ttl", "20s", key, "--", "sh", "-c",
		`printf '%s\n%s\n%s\n' "$DLOCK_KEY" "$DLOCK_TOKEN" "$DLOCK_DEADLINE"; cat; echo to stderr >&2`)
	if code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
	}
	if stderr != "to stderr\n" {
		t.Errorf("stderr %q, want the command's own %q", stderr, "to stderr\n")
	}
	lines := strings.Split(stdout, "\n")
	if len(lines) != 5 || lines[3] != "from stdin" {
		t.Fatalf("stdout %q: want key, token, deadline, then stdin", stdout)
	}
	if lines[0] != key {
		t.Errorf("DLOCK_KEY=%q, want %q", lines[0], key)
	}
	token, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil || token == 0 {
		t.Errorf("DLOCK_TOKEN=%q: want a fencing token (a positive integer)", lines[1])
	}
	deadline, err := time.Parse(time.RFC3339, lines[2])
	if err != nil {
		t.Errorf("DLOCK_DEADLINE=%q: %v", lines[2], err)
	} else if !deadline.After(start) || deadline.After(time.Now().Add(20*time.Second)) {
		t.Errorf("DLOCK_DEADLINE=%v: want within the 20s TTL from %v", deadline, start)
	}
	if next := runAssertFree(t, url, key); uint64(next) <= token {
		t.Errorf("the next holder's token %d is not above the command's %d", next, token)
	}
}

func TestRunSerializes(t *testing.T) {
	for _, b := range []struct {
		name string
		url  func(*testing.T) string
	}{{"redis", runRedisURL}, {"etcd", runEtcdURL}} {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			key := runKey(t)
			log := filepath.Join(t.TempDir(), "log")
			const n = 3
			var ps []*runProc
			for i := range n {
				ps = append(ps, startRun(t, nil, "", "run", "--url", url, "--wait", "0", key, "--", "sh", "-c",
					fmt.Sprintf(`echo "start %d $DLOCK_TOKEN" >> %s; sleep 0.3; echo "end %d" >> %s`, i, log, i, log)))
			}
			for _, p := range ps {
				if code := p.wait(t); code != 0 {
					t.Fatalf("exit status %d; stderr:\n%s", code, p.stderr.String())
				}
			}
			b, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) != 2*n {
				t.Fatalf("log %q: want %d lines", b, 2*n)
			}
			var last uint64
			for i := 0; i < len(lines); i += 2 {
				var id, id2 int
				var token uint64
				if _, err := fmt.Sscanf(lines[i], "start %d %d", &id, &token); err != nil {
					t.Fatalf("log %q: line %d: %v", b, i+1, err)
				}
				if _, err := fmt.Sscanf(lines[i+1], "end %d", &id2); err != nil || id2 != id {
					t.Fatalf("log:\n%s\ncommands overlapped: %q follows %q", b, lines[i+1], lines[i])
				}
				if token <= last {
					t.Errorf("log:\n%s\ntokens not increasing", b)
				}
				last = token
			}
		})
	}
}

// runDelRedisKey deletes key on the Redis server at addr (an admin's DEL,
// behind the lock holder's back).
func runDelRedisKey(t *testing.T, addr, key string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "*2\r\n$3\r\nDEL\r\n$%d\r\n%s\r\n", len(key), key)
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if reply != ":1\r\n" {
		t.Fatalf("DEL %s: %q, want :1 (the lock key)", key, reply)
	}
}

func TestRunLeaseLostStopsCommand(t *testing.T) {
	addr := servers.Redis(t, 1)[0].Addr()
	url := "redis://" + addr
	for _, tc := range []struct {
		name, trap, want string
	}{
		{"SIGTERM", `trap 'echo stopped by TERM >> "$F"; exit 0' TERM`, "stopped by TERM"},
		{"SIGKILL after grace", `trap 'echo TERM ignored >> "$F"' TERM`, "TERM ignored"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := runKey(t)
			f := filepath.Join(t.TempDir(), "f")
			p := startRun(t, []string{"F=" + f}, "", "run", "--url", url, "--ttl", "3s", "--grace", "1s", key, "--", "sh", "-c",
				tc.trap+`; echo started >> "$F"; while :; do sleep 0.1; done`)
			runWaitFile(t, p, f, "started")
			runDelRedisKey(t, addr, "dlock:{"+key+"}")
			if code := p.wait(t); code != exitLeaseLost {
				t.Fatalf("exit status %d, want %d; stderr:\n%s", code, exitLeaseLost, p.stderr.String())
			}
			if !strings.Contains(p.stderr.String(), "dlock run: lease on "+key+" lost") {
				t.Errorf("stderr %q: want the lost lease reported", p.stderr.String())
			}
			b, _ := os.ReadFile(f)
			if !strings.Contains(string(b), tc.want) {
				t.Errorf("the command's file %q: want %q", b, tc.want)
			}
		})
	}
}

func TestRunTryHeld(t *testing.T) {
	url := runRedisURL(t)
	key := runKey(t)
	l := openTest(t, url)
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	f := filepath.Join(t.TempDir(), "ran")

	_, stderr, code := runDlock(t, nil, "", "run", "--url", url, "--try", key, "--", "touch", f)
	if code != exitNotAcquired {
		t.Errorf("--try: exit status %d, want %d; stderr:\n%s", code, exitNotAcquired, stderr)
	}
	if want := "dlock run: " + key + " is held (--try)\n"; stderr != want {
		t.Errorf("--try: stderr %q, want %q", stderr, want)
	}

	start := time.Now()
	_, stderr, code = runDlock(t, nil, "", "run", "--url", url, "--wait", "1s", key, "--", "touch", f)
	if code != exitNotAcquired {
		t.Errorf("--wait 1s: exit status %d, want %d; stderr:\n%s", code, exitNotAcquired, stderr)
	}
	if el := time.Since(start); el < time.Second {
		t.Errorf("--wait 1s gave up after %v", el)
	}
	if !strings.Contains(stderr, "not acquired within 1s (--wait)") {
		t.Errorf("--wait: stderr %q", stderr)
	}
	if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command ran without the lock (stat: %v)", err)
	}
	if err := le.Err(); err != nil {
		t.Errorf("the holder's lease: %v", err)
	}
}

func TestRunForwardsSignals(t *testing.T) {
	url := runRedisURL(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			key := runKey(t)
			f := filepath.Join(t.TempDir(), "f")
			p := startRun(t, []string{"F=" + f}, "", "run", "--url", url, key, "--", "sh", "-c",
				`trap 'echo got signal >> "$F"; exit 7' TERM INT; echo started >> "$F"; while :; do sleep 0.1; done`)
			runWaitFile(t, p, f, "started")
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t); code != 7 {
				t.Fatalf("exit status %d, want the command's 7; stderr:\n%s", code, p.stderr.String())
			}
			b, _ := os.ReadFile(f)
			if !strings.Contains(string(b), "got signal") {
				t.Errorf("the command's file %q: the signal did not reach it", b)
			}
			runAssertFree(t, url, key)
		})
	}
}

func TestRunUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want int
		msg  string
	}{
		{"no key", []string{"run", "--url", "mem://"}, nil, exitUsage, "missing KEY"},
		{"no --", []string{"run", "--url", "mem://", "k", "true"}, nil, exitUsage, "want KEY -- COMMAND"},
		{"no command", []string{"run", "--url", "mem://", "k", "--"}, nil, exitUsage, "missing COMMAND"},
		{"try and wait", []string{"run", "--url", "mem://", "--try", "--wait", "1s", "k", "--", "true"}, nil, exitUsage, "exclude"},
		{"elect and try", []string{"run", "--url", "mem://", "--elect", "--try", "k", "--", "true"}, nil, exitUsage, "--elect and --try exclude each other"},
		{"elect and max-hold", []string{"run", "--url", "mem://", "--elect", "--max-hold", "1m", "k", "--", "true"}, nil, exitUsage, "--elect and --max-hold exclude each other"},
		{"bad holder", []string{"run", "--url", "mem://", "--holder", "a\tb", "k", "--", "true"}, nil, exitUsage, `--holder "a\tb"`},
		{"elect not found", []string{"run", "--url", "mem://", "--elect", "k", "--", "dlock-no-such-command"}, nil, exitNotFound, "not found"},
		{"no backend", []string{"run", "k", "--", "true"}, []string{"DLOCK_URL="}, exitUsage, "no backend"},
		{"url and purpose", []string{"run", "--url", "mem://", "--purpose", "correctness", "k", "--", "true"}, nil, exitUsage, "exclude"},
		{"bad purpose", []string{"run", "--purpose", "speed", "k", "--", "true"}, nil, exitUsage, "--purpose"},
		{"bad flag", []string{"run", "--nope", "k", "--", "true"}, nil, exitUsage, "flag provided but not defined"},
		{"not found", []string{"run", "--url", "mem://", "k", "--", "dlock-no-such-command"}, nil, exitNotFound, "not found"},
		{"not executable", []string{"run", "--url", "mem://", "k", "--", "/dev/null"}, nil, exitCannotRun, "permission denied"},
		{"bad url", []string{"run", "--url", "nosuch://x", "k", "--", "true"}, nil, exitDlockFailed, "unknown scheme"},
		{"purpose refused", []string{"run", "--purpose", "correctness", "k", "--", "true"},
			[]string{"DLOCK_CORRECTNESS_URL=redis://127.0.0.1:1"}, exitDlockFailed, "cannot serve purpose"},
		{"ok on mem", []string{"run", "--url", "mem://", "k", "--", "true"}, nil, exitOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runDlock(t, tc.env, "", tc.args...)
			if code != tc.want || !strings.Contains(stderr, tc.msg) {
				t.Errorf("exit status %d, stderr %q; want %d and %q", code, stderr, tc.want, tc.msg)
			}
		})
	}
	stdout, _, code := runDlock(t, nil, "", "run", "-h")
	if code != 0 || !strings.HasPrefix(stdout, "usage: dlock run [flags] KEY -- COMMAND [ARGS...]\n") {
		t.Errorf("run -h: status %d, stdout %q", code, stdout)
	}
}

// TestRunPurpose: --purpose opens the URL of $DLOCK_CORRECTNESS_URL or
// $DLOCK_EFFICIENCY_URL, not $DLOCK_URL.
func TestRunPurpose(t *testing.T) {
	env := []string{
		"DLOCK_URL=nosuch://not-this-one",
		"DLOCK_CORRECTNESS_URL=" + runEtcdURL(t),
		"DLOCK_EFFICIENCY_URL=" + runRedisURL(t),
	}
	for _, p := range []string{"correctness", "efficiency"} {
		t.Run(p, func(t *testing.T) {
			key := runKey(t)
			stdout, stderr, code := runDlock(t, env, "", "run", "--purpose", p, key, "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
			if code != 0 {
				t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
			}
			if tok, err := strconv.ParseUint(strings.TrimSpace(stdout), 10, 64); err != nil || tok == 0 {
				t.Errorf("DLOCK_TOKEN=%q", stdout)
			}
		})
	}
}

// runRedisSubscribers returns the number of subscribers of channel on the
// Redis server at addr (PUBSUB NUMSUB).
func runRedisSubscribers(t *testing.T, addr, channel string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "*3\r\n$6\r\nPUBSUB\r\n$6\r\nNUMSUB\r\n$%d\r\n%s\r\n", len(channel), channel)
	r := bufio.NewReader(c)
	for { // *2, $len, the channel, :N
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, ":") {
			n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
			if err != nil {
				t.Fatalf("PUBSUB NUMSUB: %q", line)
			}
			return n
		}
	}
}

// TestRunSignalWhileWaiting: a SIGTERM to a dlock run that waits for the
// lock ends the wait (exit 128+15); the command never runs and the holder
// keeps its lock.
func TestRunSignalWhileWaiting(t *testing.T) {
	addr := servers.Redis(t, 1)[0].Addr()
	url := "redis://" + addr
	key := runKey(t)
	l := openTest(t, url)
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	f := filepath.Join(t.TempDir(), "ran")
	p := startRun(t, nil, "", "run", "--url", url, "--wait", "0", key, "--", "touch", f)
	// dlock waits once it has subscribed to the key's release channel.
	deadline := time.Now().Add(30 * time.Second)
	for runRedisSubscribers(t, addr, "dlock:{"+key+"}:released") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("dlock run is not waiting for the lock after 30s; stderr:\n%s", p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit status %d, want %d; stderr:\n%s", code, 128+int(syscall.SIGTERM), p.stderr.String())
	}
	if want := "dlock run: terminated while waiting for the lock\n"; p.stderr.String() != want {
		t.Errorf("stderr %q, want %q", p.stderr.String(), want)
	}
	if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command ran (stat: %v)", err)
	}
	if err := le.Err(); err != nil {
		t.Errorf("the holder's lease: %v", err)
	}
}

// TestRunChildEnvHasNoURLs: the command does not inherit the backend's
// URLs ($DLOCK_URL, $DLOCK_CORRECTNESS_URL, $DLOCK_EFFICIENCY_URL, which
// may hold a password), whichever of them dlock used; the rest of the
// environment and DLOCK_KEY, DLOCK_TOKEN, DLOCK_DEADLINE are there (issue
// 21, finding 5).
func TestRunChildEnvHasNoURLs(t *testing.T) {
	env := []string{
		"DLOCK_URL=redis://app:S3cretU@127.0.0.1:1",
		"DLOCK_CORRECTNESS_URL=etcd://app:S3cretC@127.0.0.1:1",
		"DLOCK_EFFICIENCY_URL=" + runRedisURL(t),
		"DLOCK_URL_NOT_A_BACKEND=kept",
	}
	stdout, stderr, code := runDlock(t, env, "", "run", "--purpose", "efficiency", runKey(t), "--", "env")
	if code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
	}
	vars := map[string]bool{}
	for line := range strings.Lines(stdout) {
		name, _, _ := strings.Cut(line, "=")
		vars[name] = true
	}
	for _, name := range []string{"DLOCK_URL", "DLOCK_CORRECTNESS_URL", "DLOCK_EFFICIENCY_URL"} {
		if vars[name] {
			t.Errorf("the command's environment has $%s", name)
		}
	}
	if strings.Contains(stdout, "S3cret") {
		t.Errorf("the command's environment holds a backend's password:\n%s", stdout)
	}
	for _, name := range []string{"DLOCK_KEY", "DLOCK_TOKEN", "DLOCK_DEADLINE", "DLOCK_URL_NOT_A_BACKEND", "PATH"} {
		if !vars[name] {
			t.Errorf("the command's environment lacks $%s:\n%s", name, stdout)
		}
	}
}
