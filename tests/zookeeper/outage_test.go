package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// cancelBound is how soon a cancelled Acquire must return while the server
// does not answer: it waits for no server (the deletion of its node goes on
// in the background), so this is generous. (The driver used to wait up to
// 2s for the server to confirm the deletion.)
const cancelBound = time.Second

// waitQueue waits until key's queue holds exactly n lock nodes and returns
// their names.
func waitQueue(t *testing.T, admin *zk.Conn, key string, n int) []string {
	t.Helper()
	var (
		kids []string
		err  error
	)
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		kids, _, err = admin.Children(parent(key))
		if errors.Is(err, zk.ErrNoNode) {
			kids, err = nil, nil
		}
		if err == nil && len(kids) == n {
			return kids
		}
	}
	t.Fatalf("queue of %q: %v (err %v), want %d nodes", key, kids, err, n)
	return nil
}

// waitWatching waits until l's session watches the node path on the server
// at addr (four-letter word wchc: watches by session): a waiter watching
// its predecessor is queued.
func waitWatching(t *testing.T, addr string, l *dlock.Locker, path string) {
	t.Helper()
	c := zkConnOf(t, l)
	session := fmt.Sprintf("0x%x", c.SessionID())
	var out string
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		var err error
		out, err = fourLetter(addr, "wchc")
		if err != nil {
			continue
		}
		mine := false
		for line := range strings.Lines(out) {
			line = strings.TrimSpace(line)
			switch {
			case strings.HasPrefix(line, "0x"):
				mine = line == session
			case mine && line == path:
				return
			}
		}
	}
	t.Fatalf("session %s does not watch %s: wchc says %q", session, path, out)
}

// errNoReturn is waitResult's error when the call has not returned.
var errNoReturn = errors.New("no return")

// waitResult waits up to bound for a call's outcome on got.
func waitResult(got <-chan error, bound time.Duration) error {
	select {
	case err := <-got:
		return err
	case <-time.After(bound):
		return errNoReturn
	}
}

// acquireAsync runs l.Acquire(ctx, key) in a goroutine and sends its error
// on the channel it returns; a lease it gets is released and reported as an
// error.
func acquireAsync(ctx context.Context, l *dlock.Locker, key string) <-chan error {
	got := make(chan error, 1)
	go func() {
		le, err := l.Acquire(ctx, key, nil)
		if err == nil {
			_ = le.Release(context.WithoutCancel(ctx))
			err = errors.New("granted")
		}
		got <- err
	}()
	return got
}

// TestCreateLostThenUnreachable: the connection breaks right after a
// create request reached the server and the client can reach no server
// afterwards, so protection mode cannot look for the node. Acquire (without
// a deadline) fails with ErrUnavailable after a reconnect cycle of the
// client instead of waiting for the ensemble; the orphan node is deleted in the background once the server
// can be reached again (well within the session timeout, so it is the
// driver's deletion, not the session's end).
func TestCreateLostThenUnreachable(t *testing.T) {
	f := newCutFixture(t)
	f.cut.armPartition()
	defer f.cut.partition(false)
	got := acquireAsync(t.Context(), f.a, f.key)
	// The request never sent is failed once the connection has been
	// down for a reconnect cycle; give it two.
	bound := 2*reconnectCycle(len(f.srv)) + 5*time.Second
	err := waitResult(got, bound)
	if f.cut.cutCount() != 1 {
		t.Fatalf("the connection was not cut during the create")
	}
	if err == errNoReturn {
		f.cut.partition(false)
		t.Fatalf("Acquire without a deadline, server unreachable, did not return within %v (then: %v)", bound, <-got)
	}
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Acquire, server unreachable after the create = %v, want ErrUnavailable", err)
	}
	t.Logf("Acquire: %v", err)
	// The server did create the node: it is there while we are cut off.
	waitQueue(t, f.admin, f.key, 1)

	f.cut.partition(false)
	takeWhenFree(t, f.admin, f.b, f.key, "after the orphan's clean-up", 0)
}

// TestWaiterRidesOutNoServer: a queued waiter's watch fires (the holder
// released) and the connection breaks as it lists the queue; the server
// refuses the client's next dials, so its requests fail with
// zk.ErrNoServer for a while. The waiter is still queued (its session lives
// on): it keeps trying and is granted the lock once the client is back,
// well within its session timeout.
func TestWaiterRidesOutNoServer(t *testing.T) {
	reconnects(t)
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	cut := &cutter{}
	holder := newLocker(t, srv, nil)
	w := newLocker(t, srv, &zookeeper.Options{Dialer: cut.dial})
	key := uniqueKey(t)
	lh, err := holder.Acquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	held := waitQueue(t, admin, key, 1)[0]
	got := acquireAsync(t.Context(), w, key)
	waitWatching(t, srv[0], w, parent(key)+"/"+held)

	cut.armOn(opGetChildren2, true)
	defer cut.partition(false)
	if err := lh.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Two refused dials: the client has failed its unsent requests with
	// zk.ErrNoServer at least once after the waiter tried again.
	cut.waitRefused(t, 2)
	if cut.cutCount() != 1 {
		t.Fatalf("the connection was not cut as the waiter listed the queue")
	}
	select {
	case err := <-got:
		t.Fatalf("queued waiter returned while the client reconnects: %v", err)
	default:
	}
	cut.partition(false)
	if err := waitResult(got, slack); err == nil || err.Error() != "granted" {
		t.Fatalf("queued waiter after a short outage = %v, want granted", err)
	}
	waitNoNodes(t, admin, key)
}

// TestTryAcquireLeavesNoNode: a TryAcquire that finds the lock held has
// deleted its own node when it returns, even over a slow link: right after
// it, the queue holds the holder's node only, and once the holder
// releases, the next TryAcquire gets the lock (no leftover node of an
// earlier TryAcquire ahead of it).
func TestTryAcquireLeavesNoNode(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	slow := &cutter{slowDeletes: 300 * time.Millisecond}
	holder := newLocker(t, srv, nil)
	tryers := []*dlock.Locker{
		newLocker(t, srv, &zookeeper.Options{Dialer: slow.dial}),
		newLocker(t, srv, &zookeeper.Options{Dialer: slow.dial}),
	}
	key := uniqueKey(t)
	for round := range 3 {
		lh, err := holder.Acquire(t.Context(), key, nil)
		if err != nil {
			t.Fatal(err)
		}
		held := waitQueue(t, admin, key, 1)[0]
		for i, l := range tryers {
			if _, err := l.TryAcquire(t.Context(), key, nil); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("round %d, Locker %d: TryAcquire while held = %v, want ErrNotAcquired", round, i, err)
			}
			kids, _, err := admin.Children(parent(key))
			if err != nil || len(kids) != 1 || kids[0] != held {
				t.Fatalf("round %d, Locker %d: queue right after a failed TryAcquire: %v (err %v), want the holder's node %s only",
					round, i, kids, err, held)
			}
		}
		if err := lh.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		l := tryers[round%len(tryers)]
		le, err := l.TryAcquire(t.Context(), key, nil)
		if err != nil {
			t.Fatalf("round %d: TryAcquire on a released key: %v", round, err)
		}
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEnsembleStopped: on a server of its own, (1) a waiter cancelled
// while the server is frozen returns at once, and its node is deleted once
// the server answers; (2) with the server stopped, a queued waiter gives up
// with ErrUnavailable a session timeout plus cutOffMargin after
// its connection broke (never sooner: the server rounds a session's expiry
// up to its next tick), saying the session may have expired, and a new
// Acquire or TryAcquire (without a deadline) fails with ErrUnavailable after
// one reconnect cycle of the client; (3) once the server is back, no node
// of theirs is left and the lock serves again.
func TestEnsembleStopped(t *testing.T) {
	reconnects(t)
	t.Parallel()
	e, err := servers.StartZooKeeper(t.Context(), 1)
	if err != nil {
		t.Fatalf("starting a server: %v", err)
	}
	t.Cleanup(func() { _ = e.Terminate(context.WithoutCancel(t.Context())) })
	srv := e.Servers()
	admin := adminConn(t, srv)
	holder, a := newLocker(t, srv, nil), newLocker(t, srv, nil)
	const waiterSession = 4 * time.Second
	w := newLocker(t, srv, &zookeeper.Options{SessionTimeout: waiterSession})
	key := uniqueKey(t)
	lh, err := holder.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	held := waitQueue(t, admin, key, 1)[0]

	// (1) Cancelled while the server is frozen.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := acquireAsync(ctx, a, key)
	waitWatching(t, srv[0], a, parent(key)+"/"+held)
	if err := e.Members[0].Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	cancel()
	err = waitResult(got, cancelBound)
	if err == errNoReturn {
		t.Errorf("cancelled Acquire, server frozen, did not return within %v", cancelBound)
		err = <-got
	}
	if err := e.Members[0].Unpause(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Acquire = %v, want ErrNotAcquired and Canceled", err)
	}
	waitQueue(t, admin, key, 1) // the holder's node only

	// (2) Stopped.
	if bound, want := w.Limits().MaxTTL, waiterSession-waiterSession/3-testTick; bound != want {
		t.Fatalf("waiter's TTL bound %v, want %v (its session timeout %v not granted?)", bound, want, waiterSession)
	}
	got = acquireAsync(t.Context(), w, key)
	waitWatching(t, srv[0], w, parent(key)+"/"+held)
	stopped := time.Now() // the connection breaks after this
	if err := e.Members[0].Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The waiter gives up a session timeout (and the margin) after its
	// connection broke.
	least := waiterSession + cutOffMargin
	bound := least + 5*time.Second
	if err := waitResult(got, bound); err == errNoReturn {
		t.Errorf("queued Acquire without a deadline, server stopped, did not return within %v", bound)
	} else if !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("queued Acquire, server stopped = %v, want ErrUnavailable", err)
	} else {
		took := time.Since(stopped)
		t.Logf("queued Acquire after %v: %v", took.Round(time.Millisecond), err)
		if took < least {
			t.Errorf("queued Acquire gave up %v after the server was stopped, before the session timeout and margin %v", took, least)
		}
		if !strings.Contains(err.Error(), "may have expired") {
			t.Errorf("queued Acquire's error %q does not say the session may have expired", err)
		}
	}
	// A new Acquire fails at the client's next round (the connection
	// has been down for longer than a reconnect cycle).
	bound = reconnectCycle(len(srv)) + 5*time.Second
	if err := waitResult(acquireAsync(t.Context(), a, key), bound); err == errNoReturn {
		t.Errorf("Acquire without a deadline, server stopped, did not return within %v", bound)
	} else if !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("Acquire, server stopped = %v, want ErrUnavailable", err)
	} else {
		t.Logf("Acquire: %v", err)
	}
	tried := make(chan error, 1)
	go func() {
		_, err := a.TryAcquire(t.Context(), key, nil)
		tried <- err
	}()
	if err := waitResult(tried, bound); err == errNoReturn {
		t.Errorf("TryAcquire without a deadline, server stopped, did not return within %v", bound)
	} else if !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("TryAcquire, server stopped = %v, want ErrUnavailable", err)
	}

	// (3) Back.
	if err := e.Members[0].Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitQueue(t, admin, key, 1) // the holder's node only
	awaitSession(t, holder)
	if err := lh.Release(t.Context()); err != nil {
		t.Fatalf("holder's Release after the restart: %v", err)
	}
	takeWhenFree(t, admin, a, key, "after the restart", lh.Token())
}

// TestWaiterSessionExpires: a waiter is cut off from the ensemble while
// queued, until the server expires its session and deletes its node. When
// the holder then releases, the waiter must not be granted the lock: it
// fails (with ErrUnavailable: its session has been cut off for longer than
// its timeout) while still cut off, without a ctx deadline. No node is left
// once it is back.
func TestWaiterSessionExpires(t *testing.T) {
	reconnects(t)
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	cut := &cutter{}
	holder := newLocker(t, srv, nil)
	const waiterSession = 2 * time.Second
	w := newLocker(t, srv, &zookeeper.Options{Dialer: cut.dial, SessionTimeout: waiterSession})
	key := uniqueKey(t)
	lh, err := holder.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	held := waitQueue(t, admin, key, 1)[0]
	got := acquireAsync(t.Context(), w, key)
	waitWatching(t, srv[0], w, parent(key)+"/"+held)

	cut.partition(true)
	defer cut.partition(false)
	// The server expires the waiter's session and deletes its node.
	if left := waitQueue(t, admin, key, 1); left[0] != held {
		t.Fatalf("queue after the waiter's expiry: %v, want the holder's node %s", left, held)
	}
	if err := lh.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	err = waitResult(got, slack)
	if err == errNoReturn {
		cut.partition(false)
		t.Fatalf("waiter whose session expired while queued did not return within %v while cut off (after reconnecting: %v)", slack, <-got)
	}
	if !errors.Is(err, dlock.ErrLeaseLost) && !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("waiter whose session expired while queued = %v, want ErrLeaseLost or ErrUnavailable", err)
	}
	t.Logf("waiter: %v", err)
	cut.partition(false)
	takeWhenFree(t, admin, w, key, "by the waiter's Locker once back", lh.Token())
}
