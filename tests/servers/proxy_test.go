package servers_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/tests/servers"
)

// silence is how long a test waits to see that no byte arrives: long enough
// for a broken proxy to let one through on loopback, short for the suite.
const silence = 300 * time.Millisecond

// target is a TCP server on loopback for the proxy to forward to. It hands
// every connection it accepts to the test (accepted), so that the test can
// read what the proxy delivered and write to the client through it.
type target struct {
	ln       net.Listener
	accepted chan net.Conn
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newTarget(t *testing.T) *target {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg := &target{ln: ln, accepted: make(chan net.Conn, 16)}
	tg.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tg.mu.Lock()
			tg.conns = append(tg.conns, c)
			tg.mu.Unlock()
			tg.accepted <- c
		}
	})
	t.Cleanup(tg.close)
	return tg
}

func (tg *target) close() {
	_ = tg.ln.Close()
	tg.wg.Wait()
	tg.mu.Lock()
	defer tg.mu.Unlock()
	for _, c := range tg.conns {
		_ = c.Close()
	}
}

// next returns the next connection the target accepted.
func (tg *target) next(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-tg.accepted:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("the target accepted no connection within 10s")
		return nil
	}
}

// noConn checks that the target accepts no connection for a while.
func (tg *target) noConn(t *testing.T, why string) {
	t.Helper()
	select {
	case <-tg.accepted:
		t.Fatalf("%s: the target got a connection", why)
	case <-time.After(silence):
	}
}

func newProxy(t *testing.T, to string) *servers.Proxy {
	t.Helper()
	p, err := servers.NewProxy(to)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// send writes b to c.
func send(t *testing.T, c net.Conn, b string) {
	t.Helper()
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(b)); err != nil {
		t.Fatalf("write %q: %v", b, err)
	}
}

// expect reads exactly want from c (within a generous bound).
func expect(t *testing.T, c net.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read %q: got %q, %v", want, got, err)
	}
	if string(got) != want {
		t.Fatalf("read %q, want %q", got, want)
	}
}

// silent checks that nothing arrives on c for a while.
func silent(t *testing.T, c net.Conn, why string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(silence))
	var b [64]byte
	n, err := c.Read(b[:])
	if n > 0 {
		t.Fatalf("%s: %q arrived", why, b[:n])
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: read = %v; want a timeout with nothing read", why, err)
	}
}

// pair dials the proxy and returns the client side and the target's side
// of the new connection, after checking that a byte passes each way.
func pair(t *testing.T, p *servers.Proxy, tg *target) (client, server net.Conn) {
	t.Helper()
	client = dial(t, p.Addr())
	server = tg.next(t)
	send(t, client, "hi")
	expect(t, server, "hi")
	send(t, server, "ho")
	expect(t, client, "ho")
	return client, server
}

func TestProxyPassThrough(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg.ln.Addr().String())
	client, server := pair(t, p, tg)

	// A megabyte each way at once, in order.
	up, down := make([]byte, 1<<20), make([]byte, 1<<20)
	_, _ = rand.Read(up)
	_, _ = rand.Read(down)
	var wg sync.WaitGroup
	var upErr, downErr error
	wg.Go(func() { _, upErr = client.Write(up) })
	wg.Go(func() { _, downErr = server.Write(down) })
	gotUp, gotDown := make([]byte, len(up)), make([]byte, len(down))
	_ = server.SetReadDeadline(time.Now().Add(30 * time.Second))
	_ = client.SetReadDeadline(time.Now().Add(30 * time.Second))
	var upRead, downRead error
	wg.Go(func() { _, upRead = io.ReadFull(server, gotUp) })
	wg.Go(func() { _, downRead = io.ReadFull(client, gotDown) })
	wg.Wait()
	if err := errors.Join(upErr, downErr, upRead, downRead); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gotUp, up) || !bytes.Equal(gotDown, down) {
		t.Fatal("bytes changed on the way through the proxy")
	}

	// A half-close is passed on, and the other direction keeps working.
	if err := client.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = server.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := server.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the client's half-close the target read %d bytes, %v; want EOF", n, err)
	}
	send(t, server, "bye")
	expect(t, client, "bye")
}

func TestProxyBlackholeHeal(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg.ln.Addr().String())
	client, server := pair(t, p, tg)

	p.Blackhole()
	// Several writes each way, while nothing passes.
	for _, s := range []string{"one ", "two ", "three"} {
		send(t, client, s)
		send(t, server, s)
	}
	silent(t, server, "client to target during the blackhole")
	silent(t, client, "target to client during the blackhole")

	// A connection opened during the blackhole is accepted but reaches
	// nothing.
	late := dial(t, p.Addr())
	send(t, late, "late")
	tg.noConn(t, "connection opened during the blackhole")
	silent(t, late, "new connection during the blackhole")

	p.Heal()
	// What was sent during the blackhole arrives, in order.
	expect(t, server, "one two three")
	expect(t, client, "one two three")
	// The connection opened during the blackhole works now.
	lateServer := tg.next(t)
	expect(t, lateServer, "late")
	send(t, lateServer, "welcome")
	expect(t, late, "welcome")
	// And the old one carries new bytes.
	send(t, client, "again")
	expect(t, server, "again")

	// Blackhole twice, Heal twice: no harm.
	p.Blackhole()
	p.Blackhole()
	send(t, client, "x")
	silent(t, server, "second blackhole")
	p.Heal()
	p.Heal()
	expect(t, server, "x")
}

func TestProxyDelay(t *testing.T) {
	const d = 500 * time.Millisecond
	tg := newTarget(t)
	p := newProxy(t, tg.ln.Addr().String())
	client, server := pair(t, p, tg)

	p.Delay(d)
	start := time.Now()
	send(t, client, "ping")
	expect(t, server, "ping")
	if took := time.Since(start); took < d {
		t.Fatalf("client to target took %v with Delay(%v)", took, d)
	}
	start = time.Now()
	send(t, server, "pong")
	expect(t, client, "pong")
	if took := time.Since(start); took < d {
		t.Fatalf("target to client took %v with Delay(%v)", took, d)
	}

	// Chunks are queued with their due times, not delivered one d after
	// the other: a megabyte (at least 32 reads of the proxy's 32 KiB
	// buffer) arrives about d after it was sent, where one sleep of d per
	// chunk would take 32 d or more.
	up := make([]byte, 1<<20)
	_, _ = rand.Read(up)
	start = time.Now()
	var werr error
	var wg sync.WaitGroup
	wg.Go(func() { _, werr = client.Write(up) })
	got := make([]byte, len(up))
	_ = server.SetReadDeadline(time.Now().Add(60 * time.Second))
	_, rerr := io.ReadFull(server, got)
	took := time.Since(start)
	wg.Wait()
	if err := errors.Join(werr, rerr); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, up) {
		t.Fatal("bytes changed or reordered on the way through the delayed proxy")
	}
	if took < d || took > 8*d {
		t.Fatalf("a megabyte took %v through Delay(%v); want about %v (one sleep of d per chunk would take 32×%v or more)", took, d, d, d)
	}

	p.Delay(0)
	send(t, server, "fast again")
	expect(t, client, "fast again")

	// Heal ends a delay too.
	p.Delay(time.Hour)
	p.Heal()
	send(t, client, "healed")
	expect(t, server, "healed")
}

func TestProxyClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tg := newTarget(t)
	p, err := servers.NewProxy(tg.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	// Connections in every state: forwarding, with delayed chunks queued,
	// stalled by a blackhole, and opened during it (not dialled yet).
	client, server := pair(t, p, tg)
	p.Delay(time.Hour)
	send(t, client, "queued")
	send(t, server, "queued")
	p.Blackhole()
	send(t, client, "held")
	late := dial(t, p.Addr())
	send(t, late, "late")

	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// Both sides of every connection are closed.
	for name, c := range map[string]net.Conn{"client": client, "target side": server, "late client": late} {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(c); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Errorf("%s after Close: %v; want EOF or a reset", name, err)
		}
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		_ = c.Close()
		t.Error("the proxy still accepts connections after Close")
	}
	tg.close()
	_ = client.Close()
	_ = late.Close()
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// closedBy checks that c is closed (EOF or a reset) within a generous
// bound, with nothing more to read.
func closedBy(t *testing.T, c net.Conn, why string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if len(b) > 0 {
		t.Fatalf("%s: %q arrived", why, b)
	}
	if err != nil && !isReset(err) {
		t.Fatalf("%s: read = %v; want EOF or a reset", why, err)
	}
}

// fired checks that ch is closed.
func fired(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the fault did not fire", what)
	}
}

func TestProxyFailRequest(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg.ln.Addr().String())
	client, server := pair(t, p, tg)

	done := p.FailNext(servers.OneShot{MinBytes: 4, Skip: 1})
	send(t, client, "ab") // shorter than MinBytes: not a request
	expect(t, server, "ab")
	send(t, client, "first") // skipped
	expect(t, server, "first")
	select {
	case <-done:
		t.Fatal("fired before the request it fails")
	default:
	}
	send(t, client, "second") // fails: never delivered, the link is cut
	fired(t, done, "FailNext")
	closedBy(t, server, "the target after the failed request")
	closedBy(t, client, "the client after the failed request")

	// One shot only: a new connection carries requests again.
	c2, s2 := pair(t, p, tg)
	send(t, c2, "third")
	expect(t, s2, "third")
}

func TestProxyDropReply(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg.ln.Addr().String())
	client, server := pair(t, p, tg)

	done := p.FailNext(servers.OneShot{DropReply: true})
	send(t, client, "apply")
	expect(t, server, "apply") // the server gets the request ...
	select {
	case <-done:
		t.Fatal("fired before the reply")
	default:
	}
	send(t, server, "applied")
	fired(t, done, "DropReply")
	closedBy(t, client, "the client waiting for the reply") // ... the client never hears
	closedBy(t, server, "the target after the dropped reply")

	c2, s2 := pair(t, p, tg)
	send(t, s2, "after")
	expect(t, c2, "after")

	// Partition: after the dropped reply nothing passes until Heal.
	done = p.FailNext(servers.OneShot{DropReply: true, Partition: true})
	send(t, c2, "apply")
	expect(t, s2, "apply")
	send(t, s2, "applied")
	fired(t, done, "DropReply with Partition")
	closedBy(t, c2, "the client waiting for the reply")
	late := dial(t, p.Addr())
	send(t, late, "again?")
	tg.noConn(t, "a connection opened after a DropReply with Partition")
	p.Heal()
	s3 := tg.next(t)
	expect(t, s3, "again?")
}

func TestProxyHealDisarms(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg.ln.Addr().String())
	client, server := pair(t, p, tg)
	done := p.FailNext(servers.OneShot{})
	p.Heal()
	send(t, client, "request")
	expect(t, server, "request")
	send(t, server, "reply")
	expect(t, client, "reply")
	select {
	case <-done:
		t.Fatal("a disarmed fault fired")
	default:
	}
}

func TestProxyCut(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg.ln.Addr().String())
	client, server := pair(t, p, tg)
	p.Blackhole()
	send(t, client, "queued") // held by the blackhole, then lost
	silent(t, server, "during the blackhole")
	p.Cut()
	p.Heal()
	closedBy(t, server, "the target after Cut")
	closedBy(t, client, "the client after Cut")
	c2, s2 := pair(t, p, tg)
	send(t, c2, "fresh")
	expect(t, s2, "fresh")
}
