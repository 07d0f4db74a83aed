package dlockcmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
)

var (
	inspectBinOnce sync.Once
	inspectBin     string
	inspectBinErr  error
)

// dlockBinary builds the command once per test process, in the directory
// of the cmd/dlock module of this checkout, which the workspace (go.work)
// names: that module is not a requirement of the development module.
func dlockBinary(t *testing.T) string {
	t.Helper()
	inspectBinOnce.Do(func() {
		const pkg = "github.com/dlock-go/dlock/cmd/dlock"
		src, err := exec.Command("go", "list", "-f", "{{.Dir}}", pkg).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = errors.New(err.Error() + "\n" + string(ee.Stderr))
			}
			inspectBinErr = errors.New("go list " + pkg + " (the tests need the workspace, go.work, in force): " + err.Error())
			return
		}
		dir, err := os.MkdirTemp("", "dlock-inspect-test")
		if err != nil {
			inspectBinErr = err
			return
		}
		inspectBin = filepath.Join(dir, "dlock")
		build := exec.Command("go", "build", "-o", inspectBin, ".")
		build.Dir = strings.TrimSpace(string(src))
		if out, err := build.CombinedOutput(); err != nil {
			inspectBinErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if inspectBinErr != nil {
		t.Fatal(inspectBinErr)
	}
	return inspectBin
}

// runInspect runs the built dlock with args (and the extra environment
// variables env) and returns its standard output, standard error and exit
// status.
func runInspect(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, dlockBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("dlock %q: %v", args, err)
	}
	return o.String(), e.String(), code
}

func openTest(t *testing.T, url string) *dlock.Locker {
	t.Helper()
	l, err := dlock.Open(t.Context(), url)
	if err != nil {
		t.Fatalf("Open(%s): %v", url, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestInspectCommandRedis(t *testing.T) {
	url := "redis://" + servers.Redis(t, 1)[0].Addr()
	l := openTest(t, url)
	key := "orders/" + t.Name()
	// Free, with the URL as the first argument (as the issue writes it).
	out, errOut, code := runInspect(t, nil, "inspect", url, key)
	if code != 0 || out != "KEY "+key+" free\n" {
		t.Errorf("dlock inspect URL KEY (free) = %q, status %d (stderr %q), want %q, 0", out, code, errOut, "KEY "+key+" free\n")
	}
	le, err := l.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.WithoutCancel(t.Context()))
	// Held, the URL from $DLOCK_URL.
	out, errOut, code = runInspect(t, []string{"DLOCK_URL=" + url}, "inspect", key)
	want := regexp.MustCompile(`^KEY ` + regexp.QuoteMeta(key) + ` held by token ` + strconv.FormatUint(uint64(le.Token()), 10) + `, [0-9.]+s left\n$`)
	if code != 0 || !want.MatchString(out) {
		t.Errorf("dlock inspect KEY (held) = %q, status %d (stderr %q), want a match for %s, 0", out, code, errOut, want)
	}
	// --json, the URL from --url.
	out, errOut, code = runInspect(t, nil, "inspect", "--json", "--url", url, key)
	var got struct {
		Key     string   `json:"key"`
		Held    bool     `json:"held"`
		Token   *uint64  `json:"token"`
		Holder  *string  `json:"holder"`
		TTL     *float64 `json:"ttl_seconds"`
		Waiters *int     `json:"waiters"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 {
		t.Fatalf("dlock inspect --json = %q, status %d (stderr %q): %v", out, code, errOut, err)
	}
	if got.Key != key || !got.Held || got.Token == nil || *got.Token != uint64(le.Token()) ||
		got.TTL == nil || *got.TTL <= 0 || *got.TTL > 30 || got.Waiters != nil || got.Holder != nil {
		t.Errorf("dlock inspect --json = %s, want key %q held by token %d, ttl_seconds in (0, 30], waiters null, holder null (none given)", out, key, le.Token())
	}
	// The lock is untouched.
	if err := le.Refresh(t.Context(), 30*time.Second); err != nil {
		t.Errorf("Refresh after inspect: %v", err)
	}
}

func TestInspectCommandEtcdWaiter(t *testing.T) {
	url := "etcd://" + strings.Join(servers.Etcd(t, 1).Endpoints(), ",")
	holder, waiter := openTest(t, url), openTest(t, url)
	key := "orders/" + t.Name()
	le, err := holder.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.WithoutCancel(t.Context()))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		wl, err := waiter.Acquire(ctx, key, nil)
		if err == nil {
			_ = wl.Release(context.WithoutCancel(ctx))
			err = errors.New("granted while held")
		}
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("waiter: %v, want ErrNotAcquired", err)
		}
	}()
	want := regexp.MustCompile(`^KEY ` + regexp.QuoteMeta(key) + ` held by token ` + strconv.FormatUint(uint64(le.Token()), 10) + `, [0-9.]+s left, 1 waiter\n$`)
	var out, errOut string
	var code int
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if out, errOut, code = runInspect(t, nil, "inspect", url, key); code != 0 || want.MatchString(out) {
			break
		}
	}
	if code != 0 || !want.MatchString(out) {
		t.Errorf("dlock inspect (held, one waiter) = %q, status %d (stderr %q), want a match for %s, 0", out, code, errOut, want)
	}
}

func TestInspectCommandErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no key", []string{"inspect", "--url", "mem://"}, 2, "dlock inspect: missing KEY"},
		{"no url", []string{"inspect", "k"}, 2, "dlock inspect: no backend"},
		{"url twice", []string{"inspect", "--url", "mem://", "mem://", "k"}, 2, "both in --url and as an argument"},
		{"too many", []string{"inspect", "mem://", "k", "extra"}, 2, "too many arguments"},
		{"bad key", []string{"inspect", "mem://", ""}, 2, "invalid key"},
		{"bad flag", []string{"inspect", "--no-such-flag", "k"}, 2, "flag provided but not defined"},
		{"unreachable", []string{"inspect", "--timeout", "3s", "redis://127.0.0.1:1", "k"}, 1, "dlock inspect: opening redis://127.0.0.1:1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := runInspect(t, []string{"DLOCK_URL="}, c.args...)
			if code != c.code || out != "" || !strings.Contains(errOut, c.msg) {
				t.Errorf("dlock %q: status %d, stdout %q, stderr %q; want status %d, no output, %q on stderr", c.args, code, out, errOut, c.code, c.msg)
			}
		})
	}
	out, _, code := runInspect(t, nil, "inspect", "-h")
	if code != 0 || !strings.HasPrefix(out, "usage: dlock inspect [flags] [URL] KEY\n") || !strings.Contains(out, "-json") {
		t.Errorf("dlock inspect -h: status %d, stdout %q", code, out)
	}
}

// TestRedisClientLogSilenced: when a Redis server cannot be reached,
// standard error holds dlock's error alone, not go-redis's own log lines
// ("redis: ... pool.go:770: ... failed to dial"), which came first (issue
// 22).
func TestRedisClientLogSilenced(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a port nobody listens on
	out, errOut, code := runInspect(t, []string{"DLOCK_URL="}, "inspect", "--timeout", "20s", "--url", "redis://"+addr, "k")
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	if code != exitFailure || out != "" || len(lines) != 1 || !strings.HasPrefix(lines[0], "dlock inspect: opening redis://"+addr) ||
		strings.Contains(errOut, "pool.go") {
		t.Errorf("status %d, stdout %q, stderr %q; want 1 and dlock's error alone, one line", code, out, errOut)
	}
}
