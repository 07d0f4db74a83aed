package zookeeper_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// slack bounds how late a signal may come: generous, as test machines are
// noisy. The tests check that things happen, not how fast.
const slack = 15 * time.Second

// cutter is a zk.Dialer whose connections the test can cut: right after the
// next create request is sent (its reply is lost), or all at once, refusing
// new ones (a partition).
type cutter struct {
	mu          sync.Mutex
	conns       []net.Conn
	armed       bool // cut after the next create request
	cuts        int
	partitioned bool
}

func (c *cutter) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.partitioned {
		return nil, errors.New("cutter: partitioned")
	}
	nc, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	cc := &cutConn{Conn: nc, c: c}
	c.conns = append(c.conns, nc)
	return cc, nil
}

// partition cuts every connection and refuses new ones (on), or lets them
// through again (off).
func (c *cutter) partition(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partitioned = on
	if on {
		for _, nc := range c.conns {
			_ = nc.Close()
		}
		c.conns = nil
	}
}

func (c *cutter) arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = true
}

func (c *cutter) cutCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts
}

type cutConn struct {
	net.Conn
	c    *cutter
	dead atomic.Bool // cut: whatever the server sends is lost
}

func (cc *cutConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	if cc.dead.Load() {
		return 0, net.ErrClosed
	}
	return n, err
}

// opCreate is ZooKeeper's create request type. A request is one frame:
// length, xid, type, body; the client library writes it in one Write.
const opCreate = 1

func (cc *cutConn) Write(p []byte) (int, error) {
	cc.c.mu.Lock()
	cut := cc.c.armed && len(p) >= 12 && binary.BigEndian.Uint32(p[8:12]) == opCreate
	if cut {
		cc.c.armed = false
		cc.c.cuts++
		cc.dead.Store(true) // before the request leaves: its reply is lost
	}
	cc.c.mu.Unlock()
	n, err := cc.Conn.Write(p)
	if cut {
		time.Sleep(100 * time.Millisecond) // the server takes the create; its reply is lost
		_ = cc.Conn.Close()
	}
	return n, err
}

// waitNoNodes waits until key's queue is empty.
func waitNoNodes(t *testing.T, admin *zk.Conn, key string) {
	t.Helper()
	var kids []string
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		var err error
		kids, _, err = admin.Children(parent(key))
		if errors.Is(err, zk.ErrNoNode) || (err == nil && len(kids) == 0) {
			return
		}
	}
	t.Fatalf("lock nodes left in the queue: %v", kids)
}

// prime takes and releases the lock on key once, so that its parent node
// exists and the create a test cuts is the one that makes the lock node.
func prime(t *testing.T, l *dlock.Locker, key string) {
	t.Helper()
	le, err := l.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestConnectionLostDuringCreate: the connection drops after the create
// request reached the server, before its reply. Protection mode finds our
// node instead of creating a second one; after release no node is left and
// others can take the lock.
func TestConnectionLostDuringCreate(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	cut := &cutter{}
	a := newLocker(t, srv, &zookeeper.Options{Dialer: cut.dial})
	b := newLocker(t, srv, nil)
	key := uniqueKey(t)
	prime(t, b, key)

	cut.arm()
	la, err := a.Acquire(t.Context(), key, nil)
	if n := cut.cutCount(); n != 1 {
		t.Fatalf("the connection was cut %d times during the create, want 1", n)
	}
	if err != nil {
		t.Fatalf("Acquire across a connection lost during the create: %v", err)
	}
	kids, _, err := admin.Children(parent(key))
	if err != nil || len(kids) != 1 {
		t.Fatalf("queue after the acquire: %v (err %v); want exactly our node", kids, err)
	}
	if _, err := b.TryAcquire(t.Context(), key, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while held = %v, want ErrNotAcquired", err)
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitNoNodes(t, admin, key)
	lb, err := b.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("token %d not above the earlier %d", lb.Token(), la.Token())
	}
	_ = lb.Release(t.Context())
}

// TestCancelledDuringCreate: the caller gives up while the create's reply
// is lost; the node that the server did create is deleted in the
// background, so the lock stays free for others.
func TestCancelledDuringCreate(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	cut := &cutter{}
	a := newLocker(t, srv, &zookeeper.Options{Dialer: cut.dial})
	b := newLocker(t, srv, nil)
	key := uniqueKey(t)
	prime(t, b, key)

	cut.arm()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	_, err := a.Acquire(ctx, key, nil)
	cancel()
	if err == nil {
		t.Log("the acquire finished before its deadline; released")
	}
	if cut.cutCount() != 1 {
		t.Fatalf("the connection was not cut during the create")
	}
	if err != nil && (!errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded)) {
		t.Errorf("Acquire cut by its deadline = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	waitNoNodes(t, admin, key)
	lb, err := b.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatalf("TryAcquire after the abandoned create: %v", err)
	}
	_ = lb.Release(t.Context())
}

// TestSessionExpired: the holder is cut off from the ensemble past its
// session timeout. The server expires the session and deletes its node; the
// next holder gets a larger czxid; the old holder's Done fires, and once it
// reconnects (to learn the session is gone) its Release returns ErrNotHeld.
func TestSessionExpired(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	cut := &cutter{}
	a := newLocker(t, srv, &zookeeper.Options{Dialer: cut.dial, SessionTimeout: 2 * time.Second})
	b := newLocker(t, srv, nil)
	key := uniqueKey(t)

	la, err := a.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 2 * time.Second, AutoRefresh: true, MaxHold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	cut.partition(true)
	ctx, cancel := context.WithTimeout(t.Context(), slack)
	defer cancel()
	lb, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatalf("Acquire after the holder's session expired: %v", err)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("new holder's token %d not above the old %d", lb.Token(), la.Token())
	}
	select {
	case <-la.Done():
	case <-time.After(slack):
		t.Fatal("the cut-off holder's Done did not fire")
	}
	if err := la.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("cut-off holder's Err = %v, want ErrLeaseLost", err)
	}
	cut.partition(false)
	if err := la.Release(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("cut-off holder's Release = %v, want ErrNotHeld", err)
	}
	if err := lb.Err(); err != nil {
		t.Errorf("the new holder was disturbed: %v", err)
	}
	_ = lb.Release(t.Context())
}

// tryUntilAnswered calls TryAcquire until the ensemble answers and returns
// the outcome.
func tryUntilAnswered(t *testing.T, l *dlock.Locker, key string) (*dlock.Lease, error) {
	t.Helper()
	var err error
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		var le *dlock.Lease
		le, err = l.TryAcquire(ctx, key, nil)
		cancel()
		if !errors.Is(err, dlock.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			return le, err
		}
	}
	t.Fatalf("the ensemble did not answer within %v: %v", slack, err)
	return nil, nil
}

// TestEnsembleFailures: with one server of three killed the lock stays held
// and exclusive; with two killed, Acquire fails within its deadline.
func TestEnsembleFailures(t *testing.T) {
	t.Parallel()
	e, err := servers.StartZooKeeper(t.Context(), 3)
	if err != nil {
		t.Fatalf("starting a 3-server ensemble: %v", err)
	}
	t.Cleanup(func() { _ = e.Terminate(context.WithoutCancel(t.Context())) })
	srv := e.Servers()
	a, b := newLocker(t, srv, nil), newLocker(t, srv, nil)
	key := uniqueKey(t)

	la, err := a.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 10 * time.Second, AutoRefresh: true, MaxHold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Members[0].Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := tryUntilAnswered(t, b, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while held, one server down = %v, want ErrNotAcquired", err)
	}
	if err := la.Refresh(t.Context(), 10*time.Second); err != nil {
		t.Fatalf("Refresh with one server down: %v", err)
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	lb, err := tryUntilAnswered(t, b, key)
	if err != nil {
		t.Fatalf("TryAcquire after release, one server down: %v", err)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("token %d not above the earlier %d", lb.Token(), la.Token())
	}
	if err := lb.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	if err := e.Members[1].Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	const deadline = 3 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	start := time.Now()
	le, err := a.Acquire(ctx, key, nil)
	took := time.Since(start)
	cancel()
	if err == nil {
		t.Fatalf("Acquire with two of three servers down returned a lease (token %d)", le.Token())
	}
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire with two of three down = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if took > deadline+2*time.Second {
		t.Errorf("Acquire took %v past a %v deadline", took, deadline)
	}
	t.Logf("Acquire with 2 of 3 servers down: %v after %v", err, took.Round(time.Millisecond))
}
