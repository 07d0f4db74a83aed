package zookeeper_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// serverZxid is the last zxid of the (standalone) server at addr, from
// srvr.
func serverZxid(t *testing.T, addr string) uint64 {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(line, "Zxid: "); ok {
			z, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(v), "0x"), 16, 64)
			if err != nil {
				t.Fatalf("srvr: zxid %q: %v", v, err)
			}
			return z
		}
	}
	t.Fatalf("srvr on %s: no zxid in %q", addr, out)
	return 0
}

// TestRefreshMakesNoWrite: a refresh is not a transaction: the server's
// zxid does not move across refreshes (a transaction, even a check-only
// multi, takes a zxid). Other tests' sessions and the server's container
// reaper may write meanwhile, so a window with writes is tried again; a
// refresh that writes moves the zxid in every window.
func TestRefreshMakesNoWrite(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	l := newLocker(t, srv, nil)
	le, err := l.Acquire(t.Context(), uniqueKey(t), &dlock.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(t.Context())
	var moved []uint64
	for range 5 {
		before := serverZxid(t, srv[0])
		for range 5 {
			if err := le.Refresh(t.Context(), 30*time.Second); err != nil {
				t.Fatalf("Refresh: %v", err)
			}
		}
		after := serverZxid(t, srv[0])
		if after == before {
			return
		}
		moved = append(moved, after-before)
	}
	t.Errorf("the server's zxid moved across every window of 5 refreshes, by %v: a refresh is a write", moved)
}

// frameCounter wraps the client's connections and counts the requests it
// sends in rounds: a request's round is the number of replies received
// before it was written, so requests sent together (pipelined) share one.
// Replies are held back by delay, so that requests a call sends together
// are written before the first reply comes.
type frameCounter struct {
	delay time.Duration
	on    atomic.Bool

	mu       sync.Mutex
	replies  int          // replies (xid > 0) received while on
	rounds   map[int]bool // reply counts at which requests were written
	requests int
}

func (f *frameCounter) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, f: f}, nil
}

// start resets the counts and starts counting.
func (f *frameCounter) start() {
	f.mu.Lock()
	f.replies, f.requests, f.rounds = 0, 0, map[int]bool{}
	f.mu.Unlock()
	f.on.Store(true)
}

// stop stops counting and returns the requests sent and their rounds.
func (f *frameCounter) stop() (requests, rounds int) {
	f.on.Store(false)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests, len(f.rounds)
}

type countedConn struct {
	net.Conn
	f        *frameCounter
	in, out  []byte // partial frames
	inFrames int    // frames read (the first is the connect response)
}

// frames splits buf into the length-prefixed frames it completes, calling
// fn with each frame's body, and returns the remainder.
func frames(buf []byte, fn func(body []byte)) []byte {
	for len(buf) >= 4 {
		n := int(binary.BigEndian.Uint32(buf))
		if len(buf) < 4+n {
			break
		}
		fn(buf[4 : 4+n])
		buf = buf[4+n:]
	}
	return buf
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.out = frames(append(c.out, p...), func(body []byte) {
		if !c.f.on.Load() || len(body) < 8 {
			return
		}
		if xid := int32(binary.BigEndian.Uint32(body)); xid > 0 {
			c.f.mu.Lock()
			c.f.requests++
			c.f.rounds[c.f.replies] = true
			c.f.mu.Unlock()
		}
	})
	return c.Conn.Write(p)
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.f.on.Load() {
		time.Sleep(c.f.delay)
	}
	c.in = frames(append(c.in, p[:n]...), func(body []byte) {
		c.inFrames++
		if c.inFrames == 1 || !c.f.on.Load() || len(body) < 4 {
			return
		}
		if xid := int32(binary.BigEndian.Uint32(body)); xid > 0 {
			c.f.mu.Lock()
			c.f.replies++
			c.f.mu.Unlock()
		}
	})
	return n, err
}

// TestAcquireRoundTrips: an uncontended TryAcquire takes two round trips
// (the create, then the listing of the queue and the read of our node
// together) and Release one, as go-zookeeper's Lock and Unlock.
func TestAcquireRoundTrips(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	fc := &frameCounter{delay: 200 * time.Millisecond}
	l := newLocker(t, srv, &zookeeper.Options{Dialer: fc.dial})
	key := uniqueKey(t)
	// A persistent parent, so that no container is created or reaped.
	if _, err := adminConn(t, srv).Create(parent(key), nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	fc.start()
	le, err := l.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req, rounds := fc.stop()
	t.Logf("TryAcquire: %d requests in %d round trips", req, rounds)
	if rounds != 2 {
		t.Errorf("TryAcquire took %d round trips (%d requests), want 2: the create, then the listing and the read together", rounds, req)
	}
	fc.start()
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	req, rounds = fc.stop()
	if req != 1 || rounds != 1 {
		t.Errorf("Release sent %d requests in %d round trips, want one delete", req, rounds)
	}
}

// TestBatchRefresh: the driver refreshes many leases with one request (a
// session probe), and still finds a lease whose node was deleted (its watch
// told it) while the others are refreshed.
func TestBatchRefresh(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	fc := &frameCounter{}
	d, err := zookeeper.NewDriver(t.Context(), srv, &zookeeper.Options{SessionTimeout: testSession, Locker: &dlock.Options{Logger: quiet}, Dialer: fc.dial})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	br, ok := any(d).(backend.BatchRefresher)
	if !ok {
		t.Fatal("the driver does not implement backend.BatchRefresher")
	}
	const n = 50
	reqs := make([]backend.RefreshRequest, n)
	key := uniqueKey(t)
	for i := range reqs {
		le, err := d.TryAcquire(t.Context(), backend.Request{Key: fmt.Sprintf("%s-%d", key, i), TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		reqs[i] = backend.RefreshRequest{Lease: le, TTL: 20 * time.Second}
	}
	defer func() {
		for _, r := range reqs {
			_ = r.Lease.Release(t.Context())
		}
	}()
	fc.start()
	br.RefreshBatch(t.Context(), reqs)
	req, _ := fc.stop()
	for i, r := range reqs {
		if r.Err != nil || r.Granted != 20*time.Second {
			t.Fatalf("lease %d: granted %v, err %v", i, r.Granted, r.Err)
		}
	}
	if req != 1 {
		t.Errorf("refreshing %d leases sent %d requests, want 1", n, req)
	}

	// Delete lease 7's node behind its back.
	if err := harnessFor(t, srv).Expire(t.Context(), fmt.Sprintf("%s-%d", key, 7)); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		reqs[i].Granted, reqs[i].Err = 0, nil
	}
	br.RefreshBatch(t.Context(), reqs)
	for i, r := range reqs {
		switch {
		case i == 7 && !errors.Is(r.Err, backend.ErrNotHeld):
			t.Errorf("lease whose node was deleted: granted %v, err %v, want ErrNotHeld", r.Granted, r.Err)
		case i != 7 && r.Err != nil:
			t.Errorf("lease %d: %v", i, r.Err)
		}
	}
}

// TestLossWithoutGoroutinePerLease: leases learn of their loss through the
// driver's one event loop, without a goroutine each, and the loss still
// ends the lease promptly.
func TestLossWithoutGoroutinePerLease(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	l := newLocker(t, srv, nil)
	key := uniqueKey(t)
	// Warm up (the driver's own goroutines), then count.
	warm, err := l.Acquire(t.Context(), key+"-warm", &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Release(t.Context())
	const n = 200
	before := runtime.NumGoroutine()
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		if leases[i], err = l.Acquire(t.Context(), fmt.Sprintf("%s-%d", key, i), &dlock.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, le := range leases {
			_ = le.Release(t.Context())
		}
	}()
	// Goroutines of the acquires' calls may still be finishing: poll.
	var grew int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		grew = runtime.NumGoroutine() - before
		if grew < n/4 || time.Now().After(deadline) {
			break
		}
	}
	if grew >= n/4 {
		t.Errorf("%d held leases added %d goroutines, want O(1)", n, grew)
	}
	// Deleting one lease's node ends that lease, and only it.
	if err := (harnessFor(t, srv)).Expire(t.Context(), fmt.Sprintf("%s-%d", key, 42)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leases[42].Done():
		if err := leases[42].Err(); !errors.Is(err, dlock.ErrLeaseLost) {
			t.Errorf("Err = %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the lease whose node was deleted did not end")
	}
	for i, le := range leases {
		if i != 42 && le.Err() != nil {
			t.Errorf("lease %d ended: %v", i, le.Err())
		}
	}
}

func harnessFor(t *testing.T, srv []string) *harness {
	return &harness{servers: srv, admin: adminConn(t, srv)}
}

// TestManyLeasesRefreshed: 10,000 auto-refreshed leases on one Locker, TTL
// 3s on a session of 5s (whose TTL bound is 5s - 5s/3 - 200ms, about
// 3.13s), are all kept for three TTLs: none is lost.
func TestManyLeasesRefreshed(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 leases: not in -short")
	}
	const n, workers = 10000, 16
	srv := servers.ZooKeeper(t, 1).Servers()
	l := newLocker(t, srv, &zookeeper.Options{SessionTimeout: 5 * time.Second})
	key := uniqueKey(t)
	ao := &dlock.AcquireOptions{TTL: 3 * time.Second, AutoRefresh: true, MaxHold: 10 * time.Minute}
	leases := make([]*dlock.Lease, n)
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				le, err := l.Acquire(t.Context(), fmt.Sprintf("%s-%d", key, i), ao)
				if err != nil {
					errMu.Lock()
					first = cmp.Or(first, err)
					errMu.Unlock()
					return
				}
				leases[i] = le
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, le := range leases {
			if le != nil {
				_ = le.Release(context.Background())
			}
		}
	}()
	if first != nil {
		t.Fatalf("acquiring: %v", first)
	}
	t.Logf("%d leases acquired in %v", n, time.Since(start).Round(time.Millisecond))
	lost := func() (k int, why error) {
		for _, le := range leases {
			if err := le.Err(); err != nil {
				k++
				why = err
			}
		}
		return k, why
	}
	for end := time.Now().Add(3 * ao.TTL); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if k, why := lost(); k > 0 {
			t.Fatalf("%d of %d leases lost (e.g. %v)", k, n, why)
		}
	}
}
