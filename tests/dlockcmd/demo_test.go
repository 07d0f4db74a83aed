package dlockcmd_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/tests/servers"
)

// runDemo runs dlock demo (the dlock binary, dlockBinary) with args and returns its stdout and stderr.
func runDemo(t *testing.T, bin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var o, e bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append([]string{"demo"}, args...)...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// checkStaleWriteRejected runs the demo on url (none: its mem:// default)
// and checks that it succeeds and reports the stale write rejected.
func checkStaleWriteRejected(t *testing.T, bin string, url ...string) {
	t.Helper()
	out, errOut, err := runDemo(t, bin, url...)
	if err != nil {
		t.Fatalf("dlock demo %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(url, " "), err, out, errOut)
	}
	for _, want := range []string{
		"counter 3, highest token",
		"holder 2: acquired dlock-demo/account with token",
		"holder 1: wakes up, writes with token",
		"rejected: fence: stale token",
		`done: the resource holds "written by holder 2"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dlock demo %s: the output lacks %q:\n%s\nstderr:\n%s", strings.Join(url, " "), want, out, errOut)
		}
	}
}

// The zero-setup default: the in-process backend.
func TestDemoInProcess(t *testing.T) {
	checkStaleWriteRejected(t, dlockBinary(t))
}

// Every backend the demo imports, on real servers.
func TestDemoBackends(t *testing.T) {
	bin := dlockBinary(t)
	t.Run("redis", func(t *testing.T) {
		checkStaleWriteRejected(t, bin, "redis://"+servers.Redis(t, 1)[0].Addr())
	})
	t.Run("redlock", func(t *testing.T) {
		var addrs []string
		for _, s := range servers.Redis(t, 3) {
			addrs = append(addrs, s.Addr())
		}
		checkStaleWriteRejected(t, bin, "redlock://"+strings.Join(addrs, ",")+"?node_timeout=200ms")
	})
	t.Run("etcd", func(t *testing.T) {
		checkStaleWriteRejected(t, bin, "etcd://"+strings.Join(servers.Etcd(t, 1).Endpoints(), ","))
	})
	t.Run("zookeeper", func(t *testing.T) {
		checkStaleWriteRejected(t, bin, "zk://"+strings.Join(servers.ZooKeeper(t, 1).Servers(), ","))
	})
}

// Open is bounded, and its failure names the URL (without the password)
// and the cause.
func TestDemoOpenFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	bin := dlockBinary(t)
	start := time.Now()
	out, errOut, err := runDemo(t, bin, "redis://user:secret@"+addr)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("dlock demo with no server: %v, want exit status 1\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	if took := time.Since(start); took > time.Minute {
		t.Errorf("dlock demo with no server took %v", took)
	}
	want := "dlock demo: opening redis://user:xxxxx@" + addr + " (timeout 10s) failed: "
	if !strings.Contains(errOut, want) || !strings.Contains(errOut, "connection refused") || strings.Contains(errOut, "secret") {
		t.Errorf("stderr:\n%s\nwant a line with %q and the cause (connection refused), without the password", errOut, want)
	}
}

// A URL that does not parse is named by its scheme alone, never its text:
// it may hold a password (issue 21, finding 3). Bad escapes and a '/' in
// the password (which url.Parse's own error quotes as a port).
func TestDemoBadURLHidesPassword(t *testing.T) {
	bin := dlockBinary(t)
	for _, tc := range []struct{ raw, secret string }{
		{"redis://app:p%zzSECRET@localhost:6379", "SECRET"},
		{"redis://app:S3cr/et@localhost:6379", "S3cr"},
		{"redis://localhost:2024/S3cret@127.0.0.1:6379", "S3cret"}, // parses: the password is the path
	} {
		out, errOut, err := runDemo(t, bin, tc.raw)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("dlock demo %s: %v, want exit status 1", tc.raw, err)
		}
		if strings.Contains(out+errOut, tc.secret) {
			t.Errorf("dlock demo %s printed the password %q:\nstdout:\n%s\nstderr:\n%s", tc.raw, tc.secret, out, errOut)
		}
		if !strings.Contains(errOut, "opening redis://…") {
			t.Errorf("dlock demo %s: stderr %q does not name the scheme", tc.raw, errOut)
		}
	}
}
