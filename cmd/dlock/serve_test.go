package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

var (
	serveBinOnce sync.Once
	serveBin     string
	serveBinErr  error
)

// dlockBinary builds the command once per test process.
func dlockBinary(t *testing.T) string {
	t.Helper()
	serveBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dlock-serve-test")
		if err != nil {
			serveBinErr = err
			return
		}
		serveBin = filepath.Join(dir, "dlock")
		if out, err := exec.Command("go", "build", "-o", serveBin, ".").CombinedOutput(); err != nil {
			serveBinErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if serveBinErr != nil {
		t.Fatal(serveBinErr)
	}
	return serveBin
}

// freeLoopbackAddr returns a 127.0.0.1 address whose port was free a
// moment ago.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// servedProcess is a running `dlock serve`.
type servedProcess struct {
	cmd    *exec.Cmd
	url    string
	stdout []string // the lines printed once ready
	stderr *bytes.Buffer
	done   chan error // the result of cmd.Wait
}

// startServe starts `dlock serve` and waits for the URL it prints when
// ready.
func startServe(t *testing.T, bin, dir, addr string) *servedProcess {
	t.Helper()
	p := &servedProcess{stderr: new(bytes.Buffer), done: make(chan error, 1)}
	p.cmd = exec.Command(bin, "serve", "--data", dir, "--listen", addr)
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// One goroutine reads the output, then waits for the process (Wait
	// must come after the reads from its pipe).
	ready := make(chan []string, 1)
	go func() {
		var got []string
		sc := bufio.NewScanner(stdout)
		for len(got) < 3 && sc.Scan() {
			got = append(got, sc.Text())
		}
		ready <- got
		_, _ = io.Copy(io.Discard, stdout)
		p.done <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case err := <-p.done:
			p.done <- err
		default:
			_ = p.cmd.Process.Kill()
			p.done <- <-p.done
		}
	})
	select {
	case p.stdout = <-ready:
	case <-time.After(90 * time.Second):
		t.Fatalf("dlock serve printed no URL within 90s; stderr:\n%s", p.stderr)
	}
	if len(p.stdout) < 3 {
		t.Fatalf("dlock serve printed %q, want the URL and two more lines; stderr:\n%s", p.stdout, p.stderr)
	}
	p.url = p.stdout[0]
	return p
}

// interrupt sends SIGINT and returns the exit status.
func (p *servedProcess) interrupt(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("dlock serve: %v", err)
		}
		return 0
	case <-time.After(60 * time.Second):
		t.Fatalf("dlock serve did not stop within 60s of SIGINT; stderr:\n%s", p.stderr)
		return -1
	}
}

// acquireToken opens url, acquires key and releases it, and returns the
// token it was granted.
func acquireToken(t *testing.T, url, key string) dlock.Token {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, url)
	if err != nil {
		t.Fatalf("dlock.Open(%q): %v", url, err)
	}
	defer l.Close()
	le, err := l.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatalf("Acquire %q on %s: %v", key, url, err)
	}
	tok := le.Token()
	if err := le.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	return tok
}

// TestServeRestartKeepsTokens: dlock serve (the binary) exits with status 2
// on a bad flag; it serves an etcd that dlock.Open accepts, stops with
// status 0 on SIGINT, and, restarted on the same data directory (and
// address), grants larger tokens than before; it stops on SIGTERM too.
func TestServeRestartKeepsTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts etcd twice")
	}
	bin := dlockBinary(t)
	out, err := exec.Command(bin, "serve", "--no-such-flag").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
		t.Fatalf("dlock serve --no-such-flag: %v, want exit status 2; output:\n%s", err, out)
	}
	if want := "dlock serve: flag provided but not defined: -no-such-flag\nRun 'dlock serve -h' for usage.\n"; string(out) != want {
		t.Errorf("dlock serve --no-such-flag: output %q, want %q", out, want)
	}

	dir := t.TempDir()
	addr := freeLoopbackAddr(t)

	p := startServe(t, bin, dir, addr)
	if want := "etcd://" + addr; p.url != want {
		t.Fatalf("first line %q, want %q", p.url, want)
	}
	if want := "export DLOCK_URL=etcd://" + addr; !strings.Contains(strings.Join(p.stdout, "\n"), want) {
		t.Errorf("output %q lacks %q", p.stdout, want)
	}
	t1 := acquireToken(t, p.url, "serve-test")
	if t1 == 0 {
		t.Fatalf("token 0 from the first server")
	}
	if code := p.interrupt(t); code != 0 {
		t.Fatalf("exit status %d after SIGINT, want 0; stderr:\n%s", code, p.stderr)
	}
	if p.stderr.Len() > 0 {
		t.Errorf("stderr of a clean run: %s", p.stderr)
	}

	p2 := startServe(t, bin, dir, addr)
	t2 := acquireToken(t, p2.url, "serve-test")
	if t2 <= t1 {
		t.Errorf("token %d after the restart, want more than %d (before)", t2, t1)
	}
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p2.done:
		p2.done <- err
		if err != nil {
			t.Fatalf("after SIGTERM: %v, want exit status 0; stderr:\n%s", err, p2.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("dlock serve did not stop within 60s of SIGTERM")
	}
	t.Logf("tokens %d, then %d after the restart", t1, t2)
}

// TestServeUsage: bad flags and non-loopback addresses are usage errors
// (status 2) before anything starts; -h prints the usage (status 0).
func TestServeUsage(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--bogus"}, exitUsage, "flag provided but not defined: -bogus"},
		{[]string{"--listen", "0.0.0.0:2379"}, exitUsage, "dlock serve: --listen 0.0.0.0:2379: not a loopback address"},
		{[]string{"--listen", "192.0.2.1:2379"}, exitUsage, "not a loopback address"},
		{[]string{"--listen", "127.0.0.1"}, exitUsage, "missing port"},
		{[]string{"--listen", "127.0.0.1:0"}, exitUsage, "want a port from 1 to 65535"},
		{[]string{"--data", dir, "extra"}, exitUsage, `dlock serve: unexpected argument "extra"`},
		{[]string{"-h"}, exitOK, "usage: dlock serve [--data DIR] [--listen 127.0.0.1:2379]"},
	} {
		var stdout, stderr bytes.Buffer
		e := &env{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
		code := dispatch(context.Background(), e, append([]string{"serve"}, tc.args...))
		if code != tc.code {
			t.Errorf("dlock serve %q: status %d, want %d; stderr: %s", tc.args, code, tc.code, &stderr)
		}
		if out := stdout.String() + stderr.String(); !strings.Contains(out, tc.want) {
			t.Errorf("dlock serve %q: output %q lacks %q", tc.args, out, tc.want)
		}
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("data directory after usage errors: %v, %v; want it untouched", entries, err)
	}
}

// TestServeRefusesWebPages: dlock serve answers no web page (issue 21,
// finding 4). A page a browser shows can send a request to the loopback
// server, either directly (a "simple" cross-origin POST with Content-Type
// text/plain needs no preflight) or through DNS rebinding (a name of the
// page's own resolving to 127.0.0.1, so that the request is same-origin
// for the browser, but its Host header is that name). None of them may
// change a key, no response may allow the page to read it (no
// Access-Control-Allow-Origin), and a Host header that is not loopback is
// refused. dlock's own client (gRPC) still works.
func TestServeRefusesWebPages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts etcd")
	}
	addr := freeLoopbackAddr(t)
	p := startServe(t, dlockBinary(t), t.TempDir(), addr)
	_, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, p.url)
	if err != nil {
		t.Fatalf("dlock.Open(%s): %v", p.url, err)
	}
	defer l.Close()
	le, err := l.Acquire(ctx, "web/victim", &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}

	// {"key": "\x00", "range_end": "\x00"}: every key.
	const everything = `{"key":"AA==","range_end":"AA=="}`
	const evil = "http://evil.example"
	rebind := "rebind.evil.example:" + port
	client := &http.Client{Timeout: 30 * time.Second}
	send := func(method, path, host, origin, body string, hdr ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if body != "" {
			req.Header.Set("Content-Type", "text/plain")
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s (Host %s, Origin %q): %v", method, path, host, origin, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if a := resp.Header.Get("Access-Control-Allow-Origin"); a != "" {
			t.Errorf("%s %s (Host %s, Origin %q): Access-Control-Allow-Origin %q, want none", method, path, host, origin, a)
		}
		return resp
	}
	for _, a := range []struct{ path, host, origin, body string }{
		{"/v3/kv/deleterange", rebind, "http://" + rebind, everything}, // DNS rebinding
		{"/v3/kv/deleterange", rebind, "", everything},
		{"/v3/kv/put", rebind, "http://" + rebind, `{"key":"d2ViL3ZpY3RpbQ==","value":"eA=="}`},
		{"/v3/kv/deleterange", addr, evil, everything}, // a simple cross-origin request
		{"/v3/kv/deleterange", "localhost:" + port, evil, everything},
	} {
		if resp := send("POST", a.path, a.host, a.origin, a.body); resp.StatusCode/100 == 2 {
			t.Errorf("POST %s (Host %s, Origin %q): %s, want it refused", a.path, a.host, a.origin, resp.Status)
		}
	}
	// A preflight gets no allowance.
	send("OPTIONS", "/v3/kv/deleterange", addr, evil, "",
		"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "content-type")
	// The host check covers every HTTP endpoint; loopback names pass.
	if resp := send("GET", "/health", rebind, "", ""); resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("GET /health (Host %s): %s, want 421 Misdirected Request", rebind, resp.Status)
	}
	for _, host := range []string{addr, "localhost:" + port, "127.0.0.1", "localhost"} {
		if resp := send("GET", "/health", host, "", ""); resp.StatusCode != http.StatusOK {
			t.Errorf("GET /health (Host %s): %s, want 200", host, resp.Status)
		}
	}

	select {
	case <-le.Done():
		t.Fatalf("the lease was lost: %v", le.Err())
	default:
	}
	info, err := l.Inspect(ctx, "web/victim")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || dlock.Token(info.Token) != le.Token() {
		t.Errorf("web/victim after the requests: %+v, want held with token %d", info, le.Token())
	}
	if err := le.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}
