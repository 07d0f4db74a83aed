package servers

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// envFakeServerd makes the test binary, run as $DLOCK_SERVERD by
// TestServerdDeathReported, act as a serverd that dies: it reads one
// request and exits with status 3.
const envFakeServerd = "DLOCK_SERVERS_FAKE_SERVERD"

func init() {
	if os.Getenv(envFakeServerd) != "die" {
		return
	}
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	os.Exit(3)
}

// pipeDaemon returns a daemon whose serverd is the test: requests come out
// of reqs, and respond sends a response line to the client.
func pipeDaemon(t *testing.T) (d *daemon, reqs <-chan request, respond func(response)) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	d = &daemon{
		stdin:   inW,
		enc:     json.NewEncoder(inW),
		done:    make(chan struct{}),
		pending: map[uint64]chan response{},
	}
	go d.read(outR)
	ch := make(chan request, 16)
	go func() {
		defer close(ch)
		dec := json.NewDecoder(inR)
		for {
			var req request
			if err := dec.Decode(&req); err != nil {
				return
			}
			ch <- req
		}
	}()
	enc := json.NewEncoder(outW)
	t.Cleanup(func() {
		_ = outW.Close() // the reader ends
		<-d.done
		_ = inW.Close()
		_ = inR.Close()
	})
	return d, ch, func(r response) {
		if err := enc.Encode(r); err != nil {
			t.Errorf("respond: %v", err)
		}
	}
}

// next returns the next request the client sent, failing the test if none
// comes within a generous bound.
func next(t *testing.T, reqs <-chan request) request {
	t.Helper()
	select {
	case r, ok := <-reqs:
		if !ok {
			t.Fatal("the client closed serverd's input")
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no request from the client in 10s")
	}
	panic("unreachable")
}

// op is what a request asks for, without its id.
type op struct{ op, server, group string }

// TestCancelledNewTerminatesLateServers: servers that serverd started for
// a request whose context ended first (the response comes after the
// client gave up on it) are terminated, not left running until the test
// process ends.
func TestCancelledNewTerminatesLateServers(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp response
		want []op
	}{
		{"servers", response{Servers: []serverInfo{{ID: "s1", Kind: "redis"}, {ID: "s2", Kind: "redis"}}},
			[]op{{"terminate", "s1", ""}, {"terminate", "s2", ""}}},
		{"cluster", response{Group: "g3", Servers: []serverInfo{{ID: "s1", Kind: "etcd"}}},
			[]op{{"terminategroup", "", "g3"}}},
		{"failed", response{Error: &wireError{Msg: "servers: start redis: context canceled"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, reqs, respond := pipeDaemon(t)
			ctx, cancel := context.WithCancel(t.Context())
			errc := make(chan error, 1)
			go func() {
				_, err := d.call(ctx, request{Op: "new", Kind: "redis", N: 2})
				errc <- err
			}()
			req := next(t, reqs)
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("call with its context cancelled: %v; want context.Canceled", err)
			}
			if c := next(t, reqs); c.Op != "cancel" || c.Target != req.ID {
				t.Fatalf("after the cancellation the client sent %+v; want a cancel of request %d", c, req.ID)
			}
			resp := tc.resp
			resp.ID = req.ID
			respond(resp) // serverd had finished the start
			var got []op
			for range tc.want {
				r := next(t, reqs)
				got = append(got, op{r.Op, r.Server, r.Group})
				respond(response{ID: r.ID})
			}
			slices.SortFunc(got, func(a, b op) int { return strings.Compare(a.server, b.server) })
			if !slices.Equal(got, tc.want) {
				t.Fatalf("requests after the late response: %+v; want %+v", got, tc.want)
			}
			// Nothing more: a call still works and is the next request.
			go func() { _, err := d.call(t.Context(), request{Op: "pause", Server: "s9"}); errc <- err }()
			if r := next(t, reqs); r.Op != "pause" {
				t.Fatalf("next request %+v; want the pause", r)
			}
		})
	}
}

// TestServerdDeathReported: when serverd dies, calls in flight and later
// calls fail at once with an error that says serverd ended and how (its
// exit status), not with a bare EOF or a broken pipe.
func TestServerdDeathReported(t *testing.T) {
	t.Setenv(envServerd, os.Args[0])
	t.Setenv(envFakeServerd, "die")
	d, err := startDaemon()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for i := range 3 {
		_, err := d.call(ctx, request{Op: "new", Kind: "redis", N: 1})
		if err == nil || !strings.Contains(err.Error(), "serverd") || !strings.Contains(err.Error(), "exit status 3") {
			t.Fatalf("call %d to a serverd that exited with status 3: %v; want an error naming serverd and its exit status", i, err)
		}
		if ctx.Err() != nil {
			t.Fatalf("call %d returned only when its context ended", i)
		}
	}
	if err := d.stop(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("stop of a serverd that exited with status 3: %v; want its exit status", err)
	}
}

// TestServerdCleansUpWithoutItsStderr: serverd removes its containers when
// its input ends even if its standard error is gone by then (the go
// command that read the test process's output has exited, after a ^C): a
// write to a closed pipe on fd 1 or 2 must not kill it with SIGPIPE before
// it has cleaned up.
func TestServerdCleansUpWithoutItsStderr(t *testing.T) {
	Redis(t, 1) // skips (or fails) as any server test when there are no servers
	bin, dir, err := serverdBinary()
	if err != nil {
		t.Fatal(err)
	}
	if dir != "" {
		defer os.RemoveAll(dir)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Stderr = errW
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = errW.Close()
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if _, err := stdin.Write([]byte(`{"id":1,"op":"new","kind":"redis","n":1}` + "\n")); err != nil {
		t.Fatal(err)
	}
	var resp response
	if err := json.NewDecoder(stdout).Decode(&resp); err != nil || resp.Error != nil || len(resp.Servers) != 1 {
		t.Fatalf("new: %+v, %v", resp, err)
	}
	addr := resp.Servers[0].Addr
	_ = errR.Close() // serverd's standard error is gone
	_ = stdin.Close()
	err = cmd.Wait()
	if err != nil {
		t.Errorf("serverd after its input ended, with no standard error: %v; want a clean exit", err)
	}
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		_ = c.Close()
		t.Fatalf("the server at %s still accepts connections after serverd exited", addr)
	}
}
