package zookeeper_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// slack bounds how late a signal may come: generous, as test machines are
// noisy. The tests check that things happen, not how fast.
const slack = 15 * time.Second

// cutter is a zk.Dialer whose connections the test can cut: right after the
// next request of a given type is sent (its reply is lost), or all at once,
// refusing new ones (a partition). It can also delay delete requests (a
// slow link).
type cutter struct {
	mu            sync.Mutex
	conns         []net.Conn
	armed         int32 // cut after the next request of this type (0: none)
	thenPartition bool  // and refuse new connections from then on
	cuts          int
	partitioned   bool
	refused       int           // dials refused by the partition
	slowDeletes   time.Duration // delay before each delete request is sent
}

func (c *cutter) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.partitioned {
		c.refused++
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

// arm cuts the connection after the next create request.
func (c *cutter) arm() { c.armOn(opCreate, false) }

// armPartition is arm, and the cut starts a partition: the client cannot
// reconnect until partition(false).
func (c *cutter) armPartition() { c.armOn(opCreate, true) }

// armOn cuts the connection after the next request of type op, and starts
// a partition if partition is set.
func (c *cutter) armOn(op int32, partition bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.thenPartition = op, partition
}

func (c *cutter) cutCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts
}

// refusedCount is the number of dials the partitions refused.
func (c *cutter) refusedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

// waitRefused waits until the partitions have refused n dials.
func (c *cutter) waitRefused(t *testing.T, n int) {
	t.Helper()
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if c.refusedCount() >= n {
			return
		}
	}
	t.Fatalf("%d dials refused within %v, want %d", c.refusedCount(), slack, n)
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

// ZooKeeper's request types. A request is one frame: length, xid, type,
// body; the client library writes it in one Write.
const (
	opCreate       = 1
	opDelete       = 2
	opGetChildren2 = 12
)

func (cc *cutConn) Write(p []byte) (int, error) {
	cc.c.mu.Lock()
	var op int32 = -1
	if len(p) >= 12 {
		op = int32(binary.BigEndian.Uint32(p[8:12]))
	}
	cut := cc.c.armed != 0 && op == cc.c.armed
	slow := cc.c.slowDeletes
	if cut {
		cc.c.armed = 0
		cc.c.cuts++
		cc.dead.Store(true) // before the request leaves: its reply is lost
		if cc.c.thenPartition {
			cc.c.thenPartition = false
			cc.c.partitioned = true
		}
	}
	cc.c.mu.Unlock()
	if op == opDelete && slow > 0 {
		time.Sleep(slow)
	}
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

// cutFixture is the setup of the tests that cut a create: one server, an
// admin session, Locker a dialling through cut, Locker b dialling directly,
// and a key whose parent node exists (primed by b).
type cutFixture struct {
	srv   []string
	admin *zk.Conn
	cut   *cutter
	a, b  *dlock.Locker
	key   string
}

// newCutFixture marks t parallel and as one that reconnects, and starts a
// cutFixture on a server of its own.
func newCutFixture(t *testing.T) *cutFixture {
	t.Helper()
	reconnects(t)
	t.Parallel()
	f := &cutFixture{cut: &cutter{}}
	f.srv = servers.ZooKeeper(t, 1).Servers()
	f.admin = adminConn(t, f.srv)
	f.a = newLocker(t, f.srv, &zookeeper.Options{Dialer: f.cut.dial})
	f.b = newLocker(t, f.srv, nil)
	f.key = uniqueKey(t)
	prime(t, f.b, f.key)
	return f
}

// takeWhenFree waits until key's queue is empty and l has its session,
// then has l's TryAcquire take the lock on key (what says when, in the
// failure message), with a token above after (0: any), and releases it.
func takeWhenFree(t *testing.T, admin *zk.Conn, l *dlock.Locker, key, what string, after dlock.Token) {
	t.Helper()
	waitNoNodes(t, admin, key)
	awaitSession(t, l)
	le, err := l.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatalf("TryAcquire %s: %v", what, err)
	}
	if le.Token() <= after {
		t.Errorf("token %d not above the earlier %d", le.Token(), after)
	}
	_ = le.Release(t.Context())
}

// TestConnectionLostDuringCreate: the connection drops after the create
// request reached the server, before its reply. Protection mode finds our
// node instead of creating a second one; after release no node is left and
// others can take the lock.
func TestConnectionLostDuringCreate(t *testing.T) {
	f := newCutFixture(t)
	f.cut.arm()
	la, err := f.a.Acquire(t.Context(), f.key, nil)
	if n := f.cut.cutCount(); n != 1 {
		t.Fatalf("the connection was cut %d times during the create, want 1", n)
	}
	if err != nil {
		t.Fatalf("Acquire across a connection lost during the create: %v", err)
	}
	kids, _, err := f.admin.Children(parent(f.key))
	if err != nil || len(kids) != 1 {
		t.Fatalf("queue after the acquire: %v (err %v); want exactly our node", kids, err)
	}
	if _, err := f.b.TryAcquire(t.Context(), f.key, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while held = %v, want ErrNotAcquired", err)
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	takeWhenFree(t, f.admin, f.b, f.key, "after release", la.Token())
}

// TestCreateLostShortOutage: the connection drops after the create request
// reached the server, and the only server refuses the client's next dial.
// The client fails the requests it has not sent with zk.ErrNoServer (at
// once when it has one server, and again after the refused dial) long
// before it has been without a connection for a full reconnect cycle:
// protection mode keeps looking for our node, and Acquire succeeds once
// the server lets the client back in.
func TestCreateLostShortOutage(t *testing.T) {
	f := newCutFixture(t)
	f.cut.armPartition()
	defer f.cut.partition(false)
	got := acquireAsync(t.Context(), f.a, f.key)
	f.cut.waitRefused(t, 1)
	f.cut.partition(false)
	if err := waitResult(got, slack); err == nil || err.Error() != "granted" {
		t.Fatalf("Acquire across a create cut by a one-dial outage = %v, want granted", err)
	}
	waitNoNodes(t, f.admin, f.key)
}

// TestCancelledDuringCreate: the caller gives up while the create's reply
// is lost; the node that the server did create is deleted in the
// background, so the lock stays free for others.
func TestCancelledDuringCreate(t *testing.T) {
	f := newCutFixture(t)
	f.cut.arm()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	le, err := f.a.Acquire(ctx, f.key, nil)
	cancel()
	if err == nil {
		t.Log("the acquire finished before its deadline; released")
		if err := le.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	if f.cut.cutCount() != 1 {
		t.Fatalf("the connection was not cut during the create")
	}
	if err != nil && (!errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded)) {
		t.Errorf("Acquire cut by its deadline = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	takeWhenFree(t, f.admin, f.b, f.key, "after the abandoned create", 0)
}

// TestSessionExpired: the holder is cut off from the ensemble past its
// session timeout (its connections closed, its dials refused). The server
// expires the session and deletes its node, and another client takes the
// lock. The fault matrix's Partition cell (tests/matrix) checks the
// rest of this fault on ZooKeeper: the holder's Done fires, the next
// holder's token is larger, its late write is refused and its Release
// returns ErrNotHeld. This test checks what the cell does not: the lost
// lease's Err says why (ErrLeaseLost), and the stale Release leaves the new
// holder's lease alone (on ZooKeeper a stale release that deleted the new
// holder's node would end that lease too, its Done firing, so the cell's
// checker would see no overlap).
func TestSessionExpired(t *testing.T) {
	reconnects(t)
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	cut := &cutter{}
	a := newLocker(t, srv, &zookeeper.Options{Dialer: cut.dial, SessionTimeout: 2 * time.Second})
	b := newLocker(t, srv, nil)
	key := uniqueKey(t)

	// TTL 1s: the bound on a 2s session is 2s - 2s/3 - 200ms.
	la, err := a.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Second, AutoRefresh: true, MaxHold: time.Minute})
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
	select {
	case <-la.Done():
	case <-time.After(slack):
		t.Fatal("the cut-off holder's Done did not fire")
	}
	if err := la.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("cut-off holder's Err = %v, want ErrLeaseLost", err)
	}
	cut.partition(false)
	_ = la.Release(t.Context()) // ErrNotHeld: the Partition cell checks it
	if kids, _, err := adminConn(t, srv).Children(parent(key)); err != nil || len(kids) != 1 {
		t.Errorf("queue after the stale release: %v (err %v); want the new holder's node", kids, err)
	}
	if err := lb.Err(); err != nil {
		t.Errorf("the new holder was disturbed: %v", err)
	}
	_ = lb.Release(t.Context())
}

// TestEnsembleFailures: with the leader of three servers killed, a new
// leader is elected and the lock serves again: an Acquire started during
// the election (once its client lost its connection) rides it out (shorter
// here than a reconnect cycle of the client) and is granted, and a lease
// taken before the kill can be refreshed and released after it. With two
// of three killed, Acquire (without a deadline) fails with ErrUnavailable
// within a few seconds. (Mutual exclusion, token order and progress across
// a leader kill and restart are the fault matrix's KillRestart cell,
// tests/matrix.)
func TestEnsembleFailures(t *testing.T) {
	reconnects(t)
	t.Parallel()
	e, err := servers.StartZooKeeper(t.Context(), 3)
	if err != nil {
		t.Fatalf("starting a 3-server ensemble: %v", err)
	}
	t.Cleanup(func() { _ = e.Terminate(context.WithoutCancel(t.Context())) })
	srv := e.Servers()
	a := newLocker(t, srv, nil)
	key := uniqueKey(t)
	// Lockers that start an Acquire during the election, on keys of
	// their own (each client reconnects in its own time).
	var electors []*dlock.Locker
	for range 4 {
		electors = append(electors, newLocker(t, srv, nil))
	}

	la, err := a.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 10 * time.Second, AutoRefresh: true, MaxHold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	first := awaitLeader(t, e, nil)
	t.Logf("killing the leader, %v", e.Members[first])
	if err := e.Members[first].Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// Every server drops its clients until a new leader serves: each
	// elector starts an Acquire once its client has lost its connection.
	var during []<-chan error
	for _, l := range electors {
		awaitNoSession(t, l)
		during = append(during, acquireAsync(t.Context(), l, uniqueKey(t)))
	}
	second := awaitLeader(t, e, map[int]bool{first: true})
	t.Logf("new leader: %v, %v after the kill", e.Members[second], time.Since(killed).Round(time.Millisecond))
	for i, got := range during {
		if err := waitResult(got, slack); err == nil || err.Error() != "granted" {
			t.Errorf("elector %d: Acquire started during the election = %v, want granted", i, err)
		}
	}
	t.Logf("Acquires started during the election: done %v after the kill", time.Since(killed).Round(time.Millisecond))
	awaitSession(t, a)
	if err := la.Refresh(t.Context(), 10*time.Second); err != nil {
		t.Fatalf("Refresh after the leader was killed: %v", err)
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	// Kill a second server (the new leader): no quorum is left.
	if err := e.Members[second].Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The client tries each of the 3 servers in turn (1s connect timeout
	// each; the one left refuses clients without a quorum) and fails the
	// requests it could not send whenever it has gone through the list:
	// Acquire fails at the first such round once the connection has been
	// down for a full cycle; give it two.
	bound := 2*reconnectCycle(len(srv)) + 5*time.Second
	start := time.Now()
	le, err := acquireWithin(t, a, key, bound)
	took := time.Since(start)
	if err == nil {
		t.Fatalf("Acquire with two of three servers down returned a lease (token %d)", le.Token())
	}
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("Acquire with two of three down = %v, want ErrUnavailable", err)
	}
	t.Logf("Acquire with 2 of 3 servers down: %v after %v", err, took.Round(time.Millisecond))
}

// reconnectCycle is how long the ZooKeeper client takes to try each of n
// servers once (go-zookeeper's connect timeout is 1s) and pause 1s before
// the next round; it fails the requests it could not send (zk.ErrNoServer)
// at every round, and the driver gives up on them once its connection has
// been down for a full cycle.
func reconnectCycle(n int) time.Duration { return time.Duration(n+1) * time.Second }

// acquireWithin runs l.Acquire on key with t's context (no deadline) and
// returns its outcome, failing t if it has not returned within bound. A
// lease it returns is released.
func acquireWithin(t *testing.T, l *dlock.Locker, key string, bound time.Duration) (*dlock.Lease, error) {
	t.Helper()
	type result struct {
		le  *dlock.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		le, err := l.Acquire(t.Context(), key, nil)
		got <- result{le, err}
	}()
	select {
	case r := <-got:
		if r.le != nil {
			_ = r.le.Release(context.WithoutCancel(t.Context()))
		}
		return r.le, r.err
	case <-time.After(bound):
		t.Fatalf("Acquire without a deadline did not return within %v", bound)
		return nil, nil
	}
}

// fourLetter sends a four-letter word (the test servers allow them all)
// to the ZooKeeper server at addr and returns its answer.
func fourLetter(addr, word string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(word)); err != nil {
		return "", err
	}
	out, err := io.ReadAll(c)
	return string(out), err
}

// serverMode asks a ZooKeeper server for its mode with the four-letter
// word srvr: "leader", "follower" or "standalone" ("" with an error if it
// does not serve).
func serverMode(addr string) (string, error) {
	out, err := fourLetter(addr, "srvr")
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(out) {
		if mode, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(mode), nil
		}
	}
	return "", fmt.Errorf("srvr on %s: no mode in %q", addr, out)
}

// awaitLeader polls the members of e not in down until exactly one says it
// is the leader (every other one a follower), and returns its index.
func awaitLeader(t *testing.T, e *servers.ZooKeeperEnsemble, down map[int]bool) int {
	t.Helper()
	var last []string
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		leader, followers := -1, 0
		last = last[:0]
		for i, m := range e.Members {
			if down[i] {
				continue
			}
			mode, err := serverMode(m.Addr())
			last = append(last, fmt.Sprintf("%v: %q %v", m, mode, err))
			switch {
			case mode == "leader" && leader < 0:
				leader = i
			case mode == "follower":
				followers++
			}
		}
		if leader >= 0 && followers == len(e.Members)-len(down)-1 {
			return leader
		}
	}
	t.Fatalf("no single leader within %v: %v", slack, last)
	return -1
}

// zkConnOf returns l's ZooKeeper client.
func zkConnOf(t *testing.T, l *dlock.Locker) *zk.Conn {
	t.Helper()
	var c *zk.Conn
	if !driver.LockerAs(l, &c) {
		t.Fatal("driver.LockerAs(**zk.Conn) = false")
	}
	return c
}

// awaitSession waits until l's ZooKeeper client has its session again.
func awaitSession(t *testing.T, l *dlock.Locker) {
	t.Helper()
	c := zkConnOf(t, l)
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if c.State() == zk.StateHasSession {
			return
		}
	}
	t.Fatalf("no session within %v (state %v)", slack, c.State())
}

// awaitNoSession waits until l's ZooKeeper client has lost its connection.
func awaitNoSession(t *testing.T, l *dlock.Locker) {
	t.Helper()
	c := zkConnOf(t, l)
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if c.State() != zk.StateHasSession {
			return
		}
	}
	t.Fatalf("the client kept its connection for %v", slack)
}
