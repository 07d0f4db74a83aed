package zookeeper_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
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

// Shared leases (semaphores, readers) on real servers. The grant rule
// itself is tested on fixed and random queues in the zookeeper package
// (shared_test.go); these tests check what a user sees.

// sharedWait bounds every wait of these tests: generous, as the machine is
// shared; no test here asserts speed.
const sharedWait = 30 * time.Second

// permits and reader are the AcquireOptions of a semaphore's permit and a
// reader's lease.
func permits(n int) *dlock.AcquireOptions { return &dlock.AcquireOptions{Permits: n} }

var readerOpts = &dlock.AcquireOptions{Shared: true}

// grant is the outcome of an Acquire run in the background.
type grant struct {
	le  *dlock.Lease
	err error
}

// acquireShared runs l.Acquire(ctx, key, ao) in the background.
func acquireShared(ctx context.Context, l *dlock.Locker, key string, ao *dlock.AcquireOptions) <-chan grant {
	ch := make(chan grant, 1)
	go func() {
		le, err := l.Acquire(ctx, key, ao)
		ch <- grant{le, err}
	}()
	return ch
}

// awaitGrant waits for g's outcome and fails the test on an error.
func awaitGrant(t *testing.T, g <-chan grant, what string) *dlock.Lease {
	t.Helper()
	select {
	case r := <-g:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.le
	case <-time.After(sharedWait):
		t.Fatalf("%s: not granted within %v", what, sharedWait)
	}
	return nil
}

// notGranted checks that g has no outcome yet, after a moment for a wrong
// grant to show.
func notGranted(t *testing.T, g <-chan grant, what string) {
	t.Helper()
	select {
	case r := <-g:
		t.Fatalf("%s: returned (%v, %v) while it must wait", what, r.le, r.err)
	case <-time.After(300 * time.Millisecond):
	}
}

// waitInspect polls Inspect until key has held holders and waiters waiters.
func waitInspect(t *testing.T, l *dlock.Locker, key string, held, waiters int) dlock.LockInfo {
	t.Helper()
	var info dlock.LockInfo
	for deadline := time.Now().Add(sharedWait); ; time.Sleep(10 * time.Millisecond) {
		var err error
		info, err = l.Inspect(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Holders) == held && info.Waiters == waiters {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("Inspect(%q): %d holders and %d waiters, want %d and %d", key, len(info.Holders), info.Waiters, held, waiters)
		}
	}
}

func release(t *testing.T, les ...*dlock.Lease) {
	t.Helper()
	for _, le := range les {
		if err := le.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// TestSemaphoreNeverExceedsN: goroutines on several Lockers (each its own
// session) take permits of one semaphore, by Acquire and by TryAcquire
// retried, while one goroutine takes the key exclusively now and then; an
// atomic count of the holders inside the critical section never exceeds
// N, and never meets the exclusive holder. Seen red with the grant rule
// granting one permit too many.
func TestSemaphoreNeverExceedsN(t *testing.T) {
	t.Parallel()
	const (
		n       = 3
		lockers = 3
		workers = 24
		rounds  = 4
	)
	srv := servers.ZooKeeper(t, 1).Servers()
	ls := make([]*dlock.Locker, lockers)
	for i := range ls {
		ls[i] = newLocker(t, srv, nil)
	}
	key := uniqueKey(t)
	var shared, exclusive, most atomic.Int32
	inside := func(excl bool) error {
		if excl {
			if e := exclusive.Add(1); e != 1 || shared.Load() != 0 {
				return fmt.Errorf("exclusive holder with %d exclusive and %d shared holders", e, shared.Load())
			}
			time.Sleep(5 * time.Millisecond)
			exclusive.Add(-1)
			return nil
		}
		s := shared.Add(1)
		defer shared.Add(-1)
		for m := most.Load(); s > m && !most.CompareAndSwap(m, s); m = most.Load() {
		}
		if s > n || exclusive.Load() != 0 {
			return fmt.Errorf("%d permits of %d held (exclusive holders: %d)", s, n, exclusive.Load())
		}
		time.Sleep(5 * time.Millisecond)
		return nil
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := range workers + 1 {
		excl := w == workers
		l := ls[w%lockers]
		wg.Go(func() {
			for r := range rounds {
				ao := permits(n)
				if excl {
					ao = nil
				}
				var le *dlock.Lease
				var err error
				if (w+r)%3 == 0 {
					for {
						le, err = l.TryAcquire(ctx, key, ao)
						if !errors.Is(err, dlock.ErrNotAcquired) || ctx.Err() != nil {
							break
						}
						time.Sleep(2 * time.Millisecond)
					}
				} else {
					le, err = l.Acquire(ctx, key, ao)
				}
				if err != nil {
					errs <- err
					return
				}
				if err := inside(excl); err != nil {
					errs <- err
				}
				if err := le.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("at most %d permits held at once (of %d)", most.Load(), n)
	if most.Load() < 2 {
		t.Errorf("never more than %d permit held at once: the semaphore behaves as a mutex", most.Load())
	}
}

// TestSharedRoundTrips: an uncontended permit or reader costs what a
// mutex does: TryAcquire takes two round trips (the create, then the
// listing and the read of our node together), also beside other holders,
// and Release one.
func TestSharedRoundTrips(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	fc := &frameCounter{delay: 200 * time.Millisecond}
	l := newLocker(t, srv, &zookeeper.Options{Dialer: fc.dial})
	admin := adminConn(t, srv)
	for _, ao := range []*dlock.AcquireOptions{permits(3), readerOpts} {
		key := uniqueKey(t)
		// A persistent parent, so that no container is created or reaped.
		if _, err := admin.Create(parent(key), nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
		var les []*dlock.Lease
		for i := range 2 {
			fc.start()
			le, err := l.TryAcquire(t.Context(), key, ao)
			if err != nil {
				t.Fatal(err)
			}
			req, rounds := fc.stop()
			if rounds != 2 {
				t.Errorf("%+v, holder %d: TryAcquire took %d round trips (%d requests), want 2", ao, i+1, rounds, req)
			}
			les = append(les, le)
		}
		for _, le := range les {
			fc.start()
			if err := le.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if req, rounds := fc.stop(); req != 1 || rounds != 1 {
				t.Errorf("%+v: Release sent %d requests in %d round trips, want one delete", ao, req, rounds)
			}
		}
	}
}

// TestReadersOverlapWriterExcludes: readers hold together; a writer is
// kept out while they hold, and keeps them out while it holds.
func TestReadersOverlapWriterExcludes(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	l1, l2, l3 := newLocker(t, srv, nil), newLocker(t, srv, nil), newLocker(t, srv, nil)
	key := uniqueKey(t)
	r1, err := l1.TryAcquire(t.Context(), key, readerOpts)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l2.TryAcquire(t.Context(), key, readerOpts)
	if err != nil {
		t.Fatalf("a second reader while a reader holds: %v", err)
	}
	if _, err := l3.TryAcquire(t.Context(), key, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("writer TryAcquire while readers hold = %v, want ErrNotAcquired", err)
	}
	w := acquireShared(t.Context(), l3, key, nil)
	notGranted(t, w, "writer while readers hold")
	release(t, r1)
	notGranted(t, w, "writer while a reader holds")
	release(t, r2)
	wl := awaitGrant(t, w, "writer once the readers are gone")
	if _, err := l1.TryAcquire(t.Context(), key, readerOpts); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader TryAcquire while the writer holds = %v, want ErrNotAcquired", err)
	}
	release(t, wl)
	r3, err := l1.TryAcquire(t.Context(), key, readerOpts)
	if err != nil {
		t.Fatalf("reader once the writer is gone: %v", err)
	}
	release(t, r3)
}

// TestWaitingWriterBlocksReaders: a writer queued behind a reader keeps
// new readers out (TryAcquire fails, Acquire waits) until it has held and
// released; the reader queued behind it gets a later token.
func TestWaitingWriterBlocksReaders(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	l1, l2, l3 := newLocker(t, srv, nil), newLocker(t, srv, nil), newLocker(t, srv, nil)
	key := uniqueKey(t)
	r1, err := l1.Acquire(t.Context(), key, readerOpts)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireShared(t.Context(), l2, key, nil)
	waitInspect(t, l1, key, 1, 1)
	if _, err := l3.TryAcquire(t.Context(), key, readerOpts); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader TryAcquire while a writer waits = %v, want ErrNotAcquired", err)
	}
	r2 := acquireShared(t.Context(), l3, key, readerOpts)
	notGranted(t, r2, "reader behind a waiting writer")
	release(t, r1)
	wl := awaitGrant(t, w, "writer")
	notGranted(t, r2, "reader while the writer holds")
	release(t, wl)
	rl := awaitGrant(t, r2, "reader after the writer")
	if rl.Token() <= wl.Token() || wl.Token() <= r1.Token() {
		t.Errorf("tokens: reader %d, writer %d, reader %d; want them increasing", r1.Token(), wl.Token(), rl.Token())
	}
	release(t, rl)
}

// TestPermitsMismatch: a shared acquire whose Permits differ from those of
// the key's holders fails at once with a *PermitsError, without waiting,
// and leaves no node behind; one queued behind a waiter of other Permits
// waits, and fails once that one holds.
func TestPermitsMismatch(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	l1, l2 := newLocker(t, srv, nil), newLocker(t, srv, nil)
	key := uniqueKey(t)
	held, err := l1.Acquire(t.Context(), key, permits(2))
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error, asked, want int) {
		t.Helper()
		var pe *dlock.PermitsError
		if !errors.As(err, &pe) || pe.Asked != asked || pe.Held != want || !errors.Is(err, dlock.ErrInvalidConfig) || errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("%s = %v, want a PermitsError (asked %d, held %d) matching ErrInvalidConfig", what, err, asked, want)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), sharedWait)
	defer cancel()
	_, err = l2.TryAcquire(ctx, key, permits(3))
	check("TryAcquire of a permit of 3 on a semaphore of 2", err, 3, 2)
	_, err = l2.Acquire(ctx, key, permits(3))
	check("Acquire of a permit of 3 on a semaphore of 2", err, 3, 2)
	_, err = l2.Acquire(ctx, key, readerOpts)
	check("Acquire of a reader on a semaphore of 2", err, 0, 2)
	if ctx.Err() != nil {
		t.Fatal("the mismatched acquires waited")
	}
	kids, _, err := admin.Children(parent(key))
	if err != nil || len(kids) != 1 {
		t.Errorf("queue after the mismatches: %v (%v), want the holder's node only", kids, err)
	}
	// Exclusive on a semaphore's key is allowed: a waiting writer.
	w := acquireShared(t.Context(), l2, key, nil)
	waitInspect(t, l1, key, 1, 1)
	release(t, held)
	wl := awaitGrant(t, w, "writer on a semaphore's key")
	// A waiter ahead is no evidence: a permit of 5 behind a waiting
	// permit of 2 waits with it, and fails once that one holds (woken by
	// the writer's release).
	sem := acquireShared(t.Context(), l1, key, permits(2))
	waitInspect(t, l1, key, 1, 1)
	five := acquireShared(t.Context(), l2, key, permits(5))
	waitInspect(t, l1, key, 1, 2)
	notGranted(t, five, "a permit of 5 behind the writer and a waiting permit of 2")
	release(t, wl)
	sl := awaitGrant(t, sem, "permit of 2 after the writer")
	select {
	case r := <-five:
		check("Acquire of a permit of 5 queued behind a permit of 2 granted since", r.err, 5, 2)
	case <-time.After(sharedWait):
		t.Fatalf("the permit of 5 still waits %v after a permit of 2 was granted ahead of it", sharedWait)
	}
	release(t, sl)
	if kids, _, err := admin.Children(parent(key)); err != nil || len(kids) != 0 {
		t.Errorf("queue after the last release: %v (%v), want it empty", kids, err)
	}
}

// TestSharedTokensIncrease: every grant's token is larger than those of
// every earlier grant on the key, shared and exclusive alike.
func TestSharedTokensIncrease(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	ls := []*dlock.Locker{newLocker(t, srv, nil), newLocker(t, srv, nil), newLocker(t, srv, nil)}
	key := uniqueKey(t)
	var last dlock.Token // the largest token granted so far
	grantedTogether := func(les ...*dlock.Lease) {
		t.Helper()
		top := last
		for _, le := range les {
			if le.Token() <= last {
				t.Errorf("token %d not above %d, the largest of the earlier grants", le.Token(), last)
			}
			top = max(top, le.Token())
		}
		last = top
	}
	try := func(l *dlock.Locker, ao *dlock.AcquireOptions) *dlock.Lease {
		t.Helper()
		le, err := l.TryAcquire(t.Context(), key, ao)
		if err != nil {
			t.Fatal(err)
		}
		return le
	}
	for range 2 {
		s1 := try(ls[0], permits(2))
		grantedTogether(s1)
		s2 := try(ls[1], permits(2))
		grantedTogether(s2)
		w := acquireShared(t.Context(), ls[2], key, nil)
		waitInspect(t, ls[0], key, 2, 1)
		release(t, s1, s2)
		wl := awaitGrant(t, w, "writer")
		grantedTogether(wl)
		// Readers queue behind the writer (behind the permits they
		// would fail: another kind of shared lease).
		r1 := acquireShared(t.Context(), ls[0], key, readerOpts)
		r2 := acquireShared(t.Context(), ls[1], key, readerOpts)
		waitInspect(t, ls[0], key, 1, 2)
		release(t, wl)
		rl1, rl2 := awaitGrant(t, r1, "reader"), awaitGrant(t, r2, "reader")
		grantedTogether(rl1, rl2)
		w2 := acquireShared(t.Context(), ls[2], key, nil)
		waitInspect(t, ls[0], key, 2, 1)
		release(t, rl1, rl2)
		wl2 := awaitGrant(t, w2, "second writer")
		grantedTogether(wl2)
		release(t, wl2)
	}
}

// TestInspectShared: Inspect lists every holder of a shared key, oldest
// grant first, with its token and description, and counts its waiters;
// Keys lists the key.
func TestInspectShared(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	var b [4]byte
	_, _ = rand.Read(b[:])
	opts := &zookeeper.Options{Prefix: "/dlock-inspect-shared-" + hex.EncodeToString(b[:])}
	l1, l2 := newLocker(t, srv, opts), newLocker(t, srv, opts)
	key := uniqueKey(t)
	var les []*dlock.Lease
	for i := range 3 {
		le, err := []*dlock.Locker{l1, l2}[i%2].TryAcquire(t.Context(), key, &dlock.AcquireOptions{Permits: 3, Holder: fmt.Sprintf("h%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		les = append(les, le)
	}
	waiter := acquireShared(t.Context(), l2, key, &dlock.AcquireOptions{Permits: 3, Holder: "h3"})
	info := waitInspect(t, l1, key, 3, 1)
	if !info.Held || !info.Shared || info.Permits != 3 || info.Token != les[0].Token() || info.Holder != "h0" {
		t.Errorf("Inspect of a semaphore of 3 with 3 holders = %+v, want held, shared, permits 3, token %d, holder h0", info, les[0].Token())
	}
	for i, h := range info.Holders {
		if h.Token != les[i].Token() || h.Holder != fmt.Sprintf("h%d", i) {
			t.Errorf("Holders[%d] = %+v, want token %d, holder h%d", i, h, les[i].Token(), i)
		}
	}
	keys, err := driver.Keys(t.Context(), l1, 100)
	if err != nil || !slices.Contains(keys, key) {
		t.Errorf("Keys = %v (%v), want it to list %q", keys, err, key)
	}
	release(t, les...)
	release(t, awaitGrant(t, waiter, "the fourth permit"))

	// Readers: shared, no permits; a writer: one holder, not shared.
	r1, err := l1.TryAcquire(t.Context(), key, &dlock.AcquireOptions{Shared: true, Holder: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l2.TryAcquire(t.Context(), key, &dlock.AcquireOptions{Shared: true, Holder: "r2"})
	if err != nil {
		t.Fatal(err)
	}
	info = waitInspect(t, l1, key, 2, 0)
	if !info.Shared || info.Permits != 0 || info.Holders[0].Holder != "r1" || info.Holders[1].Token != r2.Token() {
		t.Errorf("Inspect with two readers = %+v, want shared, permits 0, r1 then r2", info)
	}
	release(t, r1, r2)
	w, err := l1.TryAcquire(t.Context(), key, &dlock.AcquireOptions{Holder: "w"})
	if err != nil {
		t.Fatal(err)
	}
	info = waitInspect(t, l1, key, 1, 0)
	if info.Shared || info.Permits != 0 || info.Holder != "w" || info.Token != w.Token() {
		t.Errorf("Inspect with a writer = %+v, want exclusive, holder w, token %d", info, w.Token())
	}
	release(t, w)
}

// TestSharedWaiterCancelLeavesNothing: a cancelled shared waiter returns
// an error matching ErrNotAcquired and context.Canceled, and leaves no
// node; a waiter behind a cancelled one (which watched it) moves up.
func TestSharedWaiterCancelLeavesNothing(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	h := &harness{servers: srv, admin: adminConn(t, srv)}
	l1, l2, l3 := newLocker(t, srv, nil), newLocker(t, srv, nil), newLocker(t, srv, nil)
	cancelled := func(what string, g <-chan grant) {
		t.Helper()
		select {
		case r := <-g:
			if !errors.Is(r.err, dlock.ErrNotAcquired) || !errors.Is(r.err, context.Canceled) {
				t.Errorf("%s = (%v, %v), want ErrNotAcquired and context.Canceled", what, r.le, r.err)
			}
		case <-time.After(sharedWait):
			t.Fatalf("%s: still waiting %v after its cancellation", what, sharedWait)
		}
	}
	noResidue := func(key string) {
		t.Helper()
		if res, err := h.Residue(t.Context(), key); err != nil || res {
			t.Errorf("Residue(%q) = %v, %v after every holder and waiter is gone", key, res, err)
		}
	}

	// A semaphore of 1: the first waiter watches the holder, the second
	// the first; the first is cancelled.
	key := uniqueKey(t)
	held, err := l1.Acquire(t.Context(), key, permits(1))
	if err != nil {
		t.Fatal(err)
	}
	ctxA, cancelA := context.WithCancel(t.Context())
	a := acquireShared(ctxA, l2, key, permits(1))
	waitInspect(t, l1, key, 1, 1)
	b := acquireShared(t.Context(), l3, key, permits(1))
	waitInspect(t, l1, key, 1, 2)
	cancelA()
	cancelled("the first permit waiter", a)
	waitInspect(t, l1, key, 1, 1)
	release(t, held)
	release(t, awaitGrant(t, b, "the permit waiter behind the cancelled one"))
	noResidue(key)

	// A reader behind a writer.
	key = uniqueKey(t)
	wl, err := l1.Acquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctxR, cancelR := context.WithCancel(t.Context())
	r := acquireShared(ctxR, l2, key, readerOpts)
	waitInspect(t, l1, key, 1, 1)
	cancelR()
	cancelled("a reader behind a writer", r)
	release(t, wl)
	noResidue(key)
}

// TestExpireDropsEveryPermit: the harness's Expire drops every lease on a
// shared key, as the conformance suite needs: every holder learns it.
func TestExpireDropsEveryPermit(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	h := &harness{servers: srv, admin: adminConn(t, srv)}
	key := uniqueKey(t)
	var les []*dlock.Lease
	for range 3 {
		le, err := newLocker(t, srv, nil).TryAcquire(t.Context(), key, permits(3))
		if err != nil {
			t.Fatal(err)
		}
		les = append(les, le)
	}
	if err := h.Expire(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	for i, le := range les {
		select {
		case <-le.Done():
			if !errors.Is(le.Err(), dlock.ErrLeaseLost) {
				t.Errorf("permit %d: Err() = %v, want ErrLeaseLost", i, le.Err())
			}
		case <-time.After(sharedWait):
			t.Errorf("permit %d: Done not closed %v after Expire", i, sharedWait)
		}
	}
	if res, err := h.Residue(t.Context(), key); err != nil || res {
		t.Errorf("Residue = %v, %v after Expire", res, err)
	}
}

// mntr reads the counters of a server's mntr four-letter word (the test
// servers allow them all).
func mntr(t *testing.T, addr string) map[string]int64 {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(sharedWait))
	if _, err := c.Write([]byte("mntr")); err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), "\t")
		if n, err := strconv.ParseInt(value, 10, 64); ok && err == nil {
			m[name] = n
		}
	}
	if len(m) == 0 {
		t.Fatalf("mntr on %s: no counters (%v)", addr, sc.Err())
	}
	return m
}

// TestSemaphoreDrain: 1,000 waiters, spread over four Lockers, queue on a
// semaphore of 4 behind a writer; once it releases, each takes a permit,
// holds it a moment and releases. All are granted, never more than 4 at
// once, and the test logs what the server counted per grant (its mntr
// counters, on a server of its own so that no other test's requests
// count): the requests it received, and the reads and writes under the
// Lockers' prefix (a namespace of its own), separately for joining the
// queue and for draining it. It runs with a hold of 1ms (grants overlap
// little) and of 20ms (the permits are all held most of the time, and each
// waiter watches the four nodes nearest ahead of it); with the longer hold,
// the permits must overlap. It asserts no speed.
func TestSemaphoreDrain(t *testing.T) {
	t.Parallel()
	const (
		n       = 4
		waiters = 1000
		lockers = 4
	)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	ens, err := servers.StartZooKeeper(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ens.Terminate(context.Background()) })
	srv := ens.Servers()
	var b [4]byte
	_, _ = rand.Read(b[:])
	ns := "drain" + hex.EncodeToString(b[:])
	opts := &zookeeper.Options{Prefix: "/" + ns}
	ls := make([]*dlock.Locker, lockers)
	for i := range ls {
		ls[i] = newLocker(t, srv, opts)
	}
	// counters reads the server's counters; each read is one more
	// request received (the four-letter word).
	counters := func() (recv, reads, writes int64) {
		m := mntr(t, srv[0])
		return m["zk_packets_received"], m["zk_cnt_"+ns+"_read_per_namespace"], m["zk_cnt_"+ns+"_write_per_namespace"]
	}
	for _, hold := range []time.Duration{time.Millisecond, 20 * time.Millisecond} {
		key := "drain-" + hold.String()
		gate, err := ls[0].Acquire(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		recv0, reads0, writes0 := counters()
		start := time.Now()
		var (
			wg                     sync.WaitGroup
			holding, most, granted atomic.Int32
		)
		errs := make(chan error, waiters)
		for i := range waiters {
			wg.Go(func() {
				le, err := ls[i%lockers].Acquire(ctx, key, permits(n))
				if err != nil {
					errs <- err
					return
				}
				granted.Add(1)
				h := holding.Add(1)
				for m := most.Load(); h > m && !most.CompareAndSwap(m, h); m = most.Load() {
				}
				time.Sleep(hold)
				holding.Add(-1)
				if err := le.Release(ctx); err != nil {
					errs <- err
				}
			})
		}
		waitInspect(t, ls[0], key, 1, waiters)
		joined := time.Since(start)
		recv1, reads1, writes1 := counters()
		start = time.Now()
		release(t, gate)
		wg.Wait()
		drained := time.Since(start)
		recv2, reads2, writes2 := counters()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if granted.Load() != waiters || most.Load() > n {
			t.Fatalf("hold %v: %d of %d waiters granted, at most %d at once (of %d)", hold, granted.Load(), waiters, most.Load(), n)
		}
		if hold >= 20*time.Millisecond && most.Load() < 2 {
			// Not speed: a semaphore that never overlaps its permits
			// is a mutex (seen with the announce of a grant left out,
			// when a waiter behind a waiting one relied on it: it then
			// woke only on its predecessor's deletion).
			t.Errorf("hold %v: the permits never overlapped (at most %d held at once)", hold, most.Load())
		}
		per := func(d int64) string { return strconv.FormatFloat(float64(d)/waiters, 'f', 2, 64) }
		t.Logf("hold %v: join: %d waiters queued in %v: per waiter %s requests received by the server, %s reads and %s writes under %s",
			hold, waiters, joined.Round(time.Millisecond), per(recv1-recv0-1), per(reads1-reads0), per(writes1-writes0), opts.Prefix)
		t.Logf("hold %v: drain: %d grants (at most %d at once) in %v (%.0f grants/s): per grant %s requests received by the server, %s reads and %s writes under %s",
			hold, waiters, most.Load(), drained.Round(time.Millisecond), waiters/drained.Seconds(), per(recv2-recv1-1), per(reads2-reads1), per(writes2-writes1), opts.Prefix)
	}
}

// TestPermitGrantWithoutWriteRight: identities with read, create and
// delete on the lock nodes (no write), which docs/security.md and
// Options.ACL say suffice, take permits of a semaphore of 1 one after the
// other, each granted while another waits behind it: a grant writes
// nothing. Before, the granted waiter rewrote its node to wake the one
// behind it (setData), which bob may not do: his Acquire failed with
// "announcing the grant: zk: not authenticated" and gave its node up.
func TestPermitGrantWithoutWriteRight(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	acl := append(zk.DigestACL(zk.PermAll, "alice", "secret-a"),
		zk.ACL{Perms: zk.PermRead | zk.PermCreate | zk.PermDelete, Scheme: "digest", ID: "bob:" + digest("bob:secret-b")})
	prefix := uniquePrefix()
	as := func(auth string) *dlock.Locker {
		return newLocker(t, srv, &zookeeper.Options{Prefix: prefix, Auth: auth, ACL: acl})
	}
	alice := as("alice:secret-a")
	alice2, bob := as("alice:secret-a"), as("bob:secret-b")
	key := uniqueKey(t)
	held, err := alice.Acquire(t.Context(), key, permits(1))
	if err != nil {
		t.Fatal(err)
	}
	b := acquireShared(t.Context(), bob, key, permits(1))
	waitInspect(t, alice, key, 1, 1)
	a2 := acquireShared(t.Context(), alice2, key, permits(1))
	waitInspect(t, alice, key, 1, 2)
	release(t, held)
	bl := awaitGrant(t, b, "bob's permit (read, create and delete only), granted with alice2 waiting behind him")
	notGranted(t, a2, "alice2's permit while bob holds the only one")
	release(t, bl)
	al := awaitGrant(t, a2, "alice2's permit after bob's release")
	if al.Token() <= bl.Token() {
		t.Errorf("tokens: bob %d, alice2 %d after him; want them increasing", bl.Token(), al.Token())
	}
	release(t, al)
}

// TestPermitsMismatchOnlyWithHolders: a request with the wrong Permits is
// in the queue for a moment before it leaves with its *PermitsError; the
// requests with the right Permits that queue behind it meanwhile must not
// take it for evidence. One holder of a permit of 2; a loop of
// TryAcquire(Permits 3) (each refused: the holders hold permits of 2)
// beside a loop of TryAcquire(Permits 2) and Release and a loop of
// Acquire(Permits 2) and Release: the permits of 2 are granted, and never
// refused with a PermitsError. Before, a permit of 3 waiting ahead counted
// as a holder: hundreds of false PermitsErrors ("the key's holders hold a
// permit of 3") in a few seconds.
func TestPermitsMismatchOnlyWithHolders(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	l1, l2, l3 := newLocker(t, srv, nil), newLocker(t, srv, nil), newLocker(t, srv, nil)
	key := uniqueKey(t)
	held, err := l1.Acquire(t.Context(), key, permits(2))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	var (
		wg                          sync.WaitGroup
		refused, tried, waited      atomic.Int32
		falseTry, falseWait, others atomic.Int32
		mu                          sync.Mutex
		firstFalse                  error
	)
	noteFalse := func(n *atomic.Int32, err error) {
		n.Add(1)
		mu.Lock()
		if firstFalse == nil {
			firstFalse = err
		}
		mu.Unlock()
	}
	wg.Go(func() { // the wrong size
		for ctx.Err() == nil {
			_, err := l2.TryAcquire(ctx, key, permits(3))
			var pe *dlock.PermitsError
			switch {
			case errors.As(err, &pe) && pe.Asked == 3 && pe.Held == 2:
				refused.Add(1)
			case ctx.Err() == nil:
				t.Errorf("TryAcquire(Permits 3) with a permit of 2 held = %v, want a PermitsError (asked 3, held 2)", err)
				return
			}
		}
	})
	cycle := func(le *dlock.Lease, err error, n, falses *atomic.Int32) bool {
		var pe *dlock.PermitsError
		switch {
		case err == nil:
			n.Add(1)
			if err := le.Release(context.WithoutCancel(ctx)); err != nil {
				others.Add(1)
				t.Errorf("Release: %v", err)
			}
		case errors.As(err, &pe):
			noteFalse(falses, err)
		case ctx.Err() != nil:
			return false
		case !errors.Is(err, dlock.ErrNotAcquired):
			others.Add(1)
			t.Errorf("a permit of 2: %v", err)
			return false
		}
		return true
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			le, err := l3.TryAcquire(ctx, key, permits(2))
			if !cycle(le, err, &tried, &falseTry) {
				return
			}
		}
	})
	wg.Go(func() {
		for ctx.Err() == nil {
			le, err := l1.Acquire(ctx, key, permits(2))
			if !cycle(le, err, &waited, &falseWait) {
				return
			}
		}
	})
	wg.Wait()
	release(t, held)
	t.Logf("in 4s: %d permits of 3 refused; permits of 2 granted: %d by TryAcquire, %d by Acquire; false PermitsErrors: %d and %d",
		refused.Load(), tried.Load(), waited.Load(), falseTry.Load(), falseWait.Load())
	if falseTry.Load()+falseWait.Load() > 0 {
		t.Errorf("%d TryAcquire and %d Acquire of a permit of 2, with permits of 2 held, failed with a PermitsError (first: %v)",
			falseTry.Load(), falseWait.Load(), firstFalse)
	}
	if refused.Load() == 0 || tried.Load() == 0 || waited.Load() == 0 {
		t.Errorf("the loops did not all run: %d refused, %d and %d granted", refused.Load(), tried.Load(), waited.Load())
	}
}

// TestStalledPermitWaiterBlocksNobody: a permit waiter whose process
// stalls (here its connection is cut, and it cannot reconnect: to the
// server it is a client that says nothing until its session times out) is
// granted by the rule when the holders release, but cannot act on it; the
// healthy waiters behind it must be granted the free permits at once, not
// once its session has expired. Semaphore of 3, three holders, the stalled
// waiter (12s session) first in line, two healthy waiters behind it. Before,
// each waiter behind another waited for its predecessor to announce its
// grant (a write the stalled one never made): the two were granted about
// 11.5s after the release.
func TestStalledPermitWaiterBlocksNobody(t *testing.T) {
	reconnects(t)
	t.Parallel()
	const session = 12 * time.Second
	srv := servers.ZooKeeper(t, 1).Servers()
	h, a, b := newLocker(t, srv, nil), newLocker(t, srv, nil), newLocker(t, srv, nil)
	cut := &cutter{}
	x := newLocker(t, srv, &zookeeper.Options{SessionTimeout: session, Dialer: cut.dial})
	key := uniqueKey(t)
	var holders []*dlock.Lease
	for range 3 {
		le, err := h.TryAcquire(t.Context(), key, permits(3))
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, le)
	}
	xctx, xcancel := context.WithCancel(t.Context())
	defer xcancel()
	acquireShared(xctx, x, key, permits(3))
	waitInspect(t, h, key, 3, 1)
	ag := acquireShared(t.Context(), a, key, permits(3))
	waitInspect(t, h, key, 3, 2)
	bg := acquireShared(t.Context(), b, key, permits(3))
	waitInspect(t, h, key, 3, 3)
	time.Sleep(200 * time.Millisecond) // the waiters' watches are set
	cut.partition(true)                // the first waiter stalls; its node lives until its session expires
	start := time.Now()
	release(t, holders...)
	al := awaitGrant(t, ag, "the second waiter")
	bl := awaitGrant(t, bg, "the third waiter")
	took := time.Since(start)
	t.Logf("the two healthy waiters behind the stalled one were granted %v after the holders' release (its session: %v)", took.Round(time.Millisecond), session)
	if took > session/3 {
		t.Errorf("the healthy waiters were granted %v after the release: they waited for the stalled waiter's session (%v) to expire", took.Round(time.Millisecond), session)
	}
	release(t, al, bl)
}

// watchCounter is a zk.Dialer that counts, per path, the child listings
// with a watch (getChildren2, watch set) that the client sends: the
// watches a waiter sets on the nodes it waits for.
type watchCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (w *watchCounter) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &watchConn{Conn: c, w: w}, nil
}

func (w *watchCounter) count(path string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n[path]
}

type watchConn struct {
	net.Conn
	w   *watchCounter
	out []byte
}

func (c *watchConn) Write(p []byte) (int, error) {
	c.out = frames(append(c.out, p...), func(body []byte) {
		// xid, type, then the path (length, bytes) and the watch flag.
		if len(body) < 12 || int32(binary.BigEndian.Uint32(body[4:8])) != opGetChildren2 {
			return
		}
		n := int(binary.BigEndian.Uint32(body[8:12]))
		if n < 0 || len(body) < 12+n+1 || body[12+n] == 0 {
			return
		}
		c.w.mu.Lock()
		c.w.n[string(body[12:12+n])]++
		c.w.mu.Unlock()
	})
	return c.Conn.Write(p)
}

// TestPermitWaitersWatchEachHolderOnce: a waiter watches the holders it
// waits for; a Locker sets one watch per holder node however often its
// waiters wait for it (the client library keeps a channel per watch set
// until the node changes, so watches set again and again on a long-held
// permit pile up). A semaphore of 8: one Locker holds 7 permits for the
// whole test; on another, two goroutines take the eighth in turn, 40 times
// each, each waiting for it while the other holds it. Each long-held
// holder node must have been watched at most once by the second Locker.
// Before, the first waiter set a watch on every holder at every look: about
// one per wait on each of the 7 nodes.
func TestPermitWaitersWatchEachHolderOnce(t *testing.T) {
	t.Parallel()
	const (
		n      = 8
		rounds = 40
	)
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	h := newLocker(t, srv, nil)
	wc := &watchCounter{n: map[string]int{}}
	w := newLocker(t, srv, &zookeeper.Options{Dialer: wc.dial})
	key := uniqueKey(t)
	var long []*dlock.Lease
	for range n - 1 {
		le, err := h.TryAcquire(t.Context(), key, permits(n))
		if err != nil {
			t.Fatal(err)
		}
		long = append(long, le)
	}
	kids := waitQueue(t, admin, key, n-1)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range rounds {
				le, err := w.Acquire(ctx, key, permits(n))
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(2 * time.Millisecond)
				if err := le.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	var counts []int
	for _, k := range kids {
		counts = append(counts, wc.count(parent(key)+"/"+k))
	}
	t.Logf("watches the second Locker set on each long-held holder over %d grants: %v", 2*rounds, counts)
	for i, c := range counts {
		if c > 1 {
			t.Errorf("holder %d (%s) watched %d times by one Locker, want at most once", i, kids[i], c)
		}
	}
	release(t, long...)
}
