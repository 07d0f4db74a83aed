package etcd_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// Shared leases (semaphore permits, readers) on etcd: see "Shared leases"
// in the etcd package's documentation. The conformance suite checks the
// cross-backend semantics; these tests press on the etcd queue's own
// scheme (its grant rule over mixed queues, its wake-ups, its cleanup).

// permitOf is the AcquireOptions of a permit of n (a reader for n 0).
func permitOf(n int, ttl time.Duration) *dlock.AcquireOptions {
	if n == 0 {
		return &dlock.AcquireOptions{Shared: true, TTL: ttl}
	}
	return &dlock.AcquireOptions{Permits: n, TTL: ttl}
}

// entries is the number of entries in key's queue now.
func entries(t *testing.T, admin *clientv3.Client, key string) int {
	t.Helper()
	resp, err := admin.Get(t.Context(), dir(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.Count)
}

// lockers returns n Lockers on eps, each with its own client.
func lockers(t *testing.T, eps []string, n int) []*dlock.Locker {
	ls := make([]*dlock.Locker, n)
	for i := range ls {
		ls[i] = newLocker(t, eps, nil)
	}
	return ls
}

// TestSemaphoreNeverExceedsN: clients of several Lockers take permits of
// one semaphore and count themselves inside the critical section: never
// more than N at once (and N is reached). In "queued" most wait in the
// queue (Acquire; some TryAcquire), so that grants come from the waiters'
// reads; in "try" all use TryAcquire, so that the queue stays short and
// grants come from the joins.
func TestSemaphoreNeverExceedsN(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	for _, try := range []bool{false, true} {
		t.Run(map[bool]string{false: "queued", true: "try"}[try], func(t *testing.T) {
			t.Parallel()
			const n = 3
			clients, rounds := 24, 8
			if try {
				clients, rounds = 12, 5
			}
			ls := lockers(t, eps, 4)
			key := uniqueKey(t)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			var (
				wg         sync.WaitGroup
				busy, most atomic.Int32
				grants     atomic.Int32
			)
			for i := range clients {
				l := ls[i%len(ls)]
				wg.Go(func() {
					for r := 0; r < rounds; {
						var le *dlock.Lease
						var err error
						if try || (i+r)%4 == 0 {
							le, err = l.TryAcquire(ctx, key, permitOf(n, 30*time.Second))
							if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
								if !try {
									r++
								}
								time.Sleep(time.Duration(1+rand.IntN(4)) * time.Millisecond)
								continue
							}
						} else {
							le, err = l.Acquire(ctx, key, permitOf(n, 30*time.Second))
						}
						if err != nil {
							t.Errorf("client %d: %v", i, err)
							return
						}
						r++
						grants.Add(1)
						b := busy.Add(1)
						if b > n {
							t.Errorf("%d permits of %d in use at once", b, n)
						}
						for m := most.Load(); b > m && !most.CompareAndSwap(m, b); m = most.Load() {
						}
						time.Sleep(time.Duration(2+rand.IntN(4)) * time.Millisecond)
						busy.Add(-1)
						if err := le.Release(ctx); err != nil {
							t.Errorf("client %d: Release: %v", i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			t.Logf("%d grants, at most %d of %d permits in use at once", grants.Load(), most.Load(), n)
			if most.Load() != n {
				t.Errorf("at most %d permits of %d were in use at once, under contention; want %d", most.Load(), n, n)
			}
			if l := entries(t, newClient(t, eps), key); l != 0 {
				t.Errorf("%d entries left in the queue", l)
			}
		})
	}
}

// TestSharedWithWriters: readers and writers of one read-write lock, and
// permits and writers of one semaphore, from several Lockers: a writer is
// always alone, a semaphore never has more than N, and readers do hold
// together. This drives the queue through its mixed states (shared
// waiters behind a writer, near it and far from it).
func TestSharedWithWriters(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	for _, n := range []int{0, 2} {
		t.Run(fmt.Sprintf("permits%d", n), func(t *testing.T) {
			t.Parallel()
			const clients, rounds = 16, 8
			ls := lockers(t, eps, 3)
			key := uniqueKey(t)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			var (
				wg                         sync.WaitGroup
				mu                         sync.Mutex
				shared, writers, mostShare int
				sharedGrants, writerGrants int
			)
			for i := range clients {
				l := ls[i%len(ls)]
				wg.Go(func() {
					for r := range rounds {
						write := (i+r)%4 == 0
						o := permitOf(n, 30*time.Second)
						if write {
							o = &dlock.AcquireOptions{TTL: 30 * time.Second}
						}
						le, err := l.Acquire(ctx, key, o)
						if err != nil {
							t.Errorf("client %d: %v", i, err)
							return
						}
						mu.Lock()
						if write {
							writers++
							writerGrants++
							if writers > 1 || shared > 0 {
								t.Errorf("a writer holds with %d writers and %d shared holders", writers, shared)
							}
						} else {
							shared++
							sharedGrants++
							mostShare = max(mostShare, shared)
							if writers > 0 || n > 0 && shared > n {
								t.Errorf("%d shared holders (of %d permits) hold with %d writers", shared, n, writers)
							}
						}
						mu.Unlock()
						time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
						mu.Lock()
						if write {
							writers--
						} else {
							shared--
						}
						mu.Unlock()
						if err := le.Release(ctx); err != nil {
							t.Errorf("client %d: Release: %v", i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			t.Logf("%d shared grants (at most %d at once), %d writer grants", sharedGrants, mostShare, writerGrants)
			if mostShare < 2 {
				t.Errorf("shared holders never held together (at most %d at once)", mostShare)
			}
			if l := entries(t, newClient(t, eps), key); l != 0 {
				t.Errorf("%d entries left in the queue", l)
			}
		})
	}
}

// TestWriterWaitingBlocksReaders: once a writer waits behind a reader,
// a new reader neither gets in (TryAcquire) nor is served before the
// writer (Acquire), and the writer gets in as soon as the reader goes.
func TestWriterWaitingBlocksReaders(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	a, b, c := newLocker(t, eps, nil), newLocker(t, eps, nil), newLocker(t, eps, nil)
	key := uniqueKey(t)
	r1, err := a.Acquire(t.Context(), key, permitOf(0, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	wch := acquireAsync(t.Context(), b, key, 30*time.Second)
	queueLen(t, admin, key, 2)
	if _, err := c.TryAcquire(t.Context(), key, permitOf(0, 30*time.Second)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader's TryAcquire behind a waiting writer: %v; want ErrNotAcquired", err)
	}
	type got struct {
		le  *dlock.Lease
		err error
	}
	rch := make(chan got, 1)
	go func() {
		le, err := c.Acquire(t.Context(), key, permitOf(0, 30*time.Second))
		rch <- got{le, err}
	}()
	queueLen(t, admin, key, 3)
	select {
	case g := <-rch:
		t.Fatalf("a reader behind a waiting writer was granted: %v", g.err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := r1.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	w := <-wch
	if w.err != nil {
		t.Fatal(w.err)
	}
	select {
	case g := <-rch:
		t.Fatalf("a reader was granted while the writer held: %v", g.err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := w.le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := <-rch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !(r1.Token() < w.le.Token() && w.le.Token() < r.le.Token()) {
		t.Errorf("tokens: reader %d, writer %d, later reader %d; want increasing", r1.Token(), w.le.Token(), r.le.Token())
	}
	if err := r.le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestPermitsMismatch: a shared acquire whose Permits differ from those of
// the key's shared holders, or of a shared waiter queued behind a writer,
// fails at once with a *PermitsError, with nothing left of it in the
// queue.
func TestPermitsMismatch(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	a, b := newLocker(t, eps, nil), newLocker(t, eps, nil)
	check := func(what, key string, asked, held, want int) {
		t.Helper()
		for _, wait := range []bool{false, true} {
			start := time.Now()
			var err error
			if wait {
				_, err = b.Acquire(t.Context(), key, permitOf(asked, 30*time.Second))
			} else {
				_, err = b.TryAcquire(t.Context(), key, permitOf(asked, 30*time.Second))
			}
			var pe *dlock.PermitsError
			if !errors.As(err, &pe) || pe.Asked != asked || pe.Held != held || !errors.Is(err, dlock.ErrInvalidConfig) {
				t.Errorf("%s (wait %v): %v; want a *PermitsError{Asked: %d, Held: %d}", what, wait, err, asked, held)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("%s (wait %v): took %v, want an answer at once", what, wait, took)
			}
			if n := entries(t, admin, key); n != want {
				t.Errorf("%s (wait %v): %d entries in the queue after it, want %d", what, wait, n, want)
			}
		}
	}

	// Against holders.
	k1 := uniqueKey(t)
	h1, err := a.Acquire(t.Context(), k1, permitOf(3, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	check("a permit of 2 while permits of 3 are held", k1, 2, 3, 1)
	check("a reader while permits of 3 are held", k1, 0, 3, 1)

	// Against a waiter ahead: a writer holds, a reader waits behind it.
	k2 := uniqueKey(t)
	wr, err := a.Acquire(t.Context(), k2, &dlock.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rch := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctx, k2, permitOf(0, 30*time.Second))
		rch <- err
	}()
	queueLen(t, admin, k2, 2)
	check("a permit of 2 behind a writer and a waiting reader", k2, 2, 0, 2)
	cancel()
	if err := <-rch; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiting reader: %v; want it cancelled", err)
	}
	for _, le := range []*dlock.Lease{h1, wr} {
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	queueLen(t, admin, k1, 0)
	queueLen(t, admin, k2, 0)
}

// TestSharedTokensIncrease: under a mix of permits and writers, each
// grant's token is larger than that of every grant released before its
// acquire began, and a writer's is larger than that of every grant
// returned before it (shared grants among themselves may come back in
// either order: they hold together).
func TestSharedTokensIncrease(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	ls := lockers(t, eps, 3)
	key := uniqueKey(t)
	const clients, rounds, n = 12, 10, 3
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var (
		wg                            sync.WaitGroup
		mu                            sync.Mutex
		released, returned, returnedX dlock.Token // the largest tokens released, returned, returned to a writer
		checked                       int
	)
	for i := range clients {
		l := ls[i%len(ls)]
		wg.Go(func() {
			for r := range rounds {
				write := (i+r)%3 == 0
				o := permitOf(n, 30*time.Second)
				if write {
					o = &dlock.AcquireOptions{TTL: 30 * time.Second}
				}
				mu.Lock()
				before := released
				mu.Unlock()
				le, err := l.Acquire(ctx, key, o)
				if err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
				tok := le.Token()
				mu.Lock()
				switch {
				case tok <= before:
					t.Errorf("token %d after a release of %d, before this acquire began", tok, before)
				case write && tok <= returned:
					t.Errorf("writer's token %d after a grant of %d was returned", tok, returned)
				case !write && tok <= returnedX:
					t.Errorf("permit's token %d after a writer's grant of %d was returned", tok, returnedX)
				}
				checked++
				returned = max(returned, tok)
				if write {
					returnedX = max(returnedX, tok)
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				if err := le.Release(ctx); err != nil {
					t.Errorf("client %d: Release: %v", i, err)
					return
				}
				mu.Lock()
				released = max(released, tok)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants checked", checked)
}

// TestInspectShared: Inspect lists every holder of a semaphore and of a
// read-write lock's readers, oldest first, with Shared, Permits, the
// waiters behind them, and Keys lists the keys.
func TestInspectShared(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	a, b := newLocker(t, eps, nil), newLocker(t, eps, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	sem := uniqueKey(t)
	var held []*dlock.Lease
	for i := range 3 {
		o := permitOf(3, 30*time.Second)
		o.Holder = fmt.Sprintf("permit-%d", i)
		le, err := []*dlock.Locker{a, b}[i%2].Acquire(t.Context(), sem, o)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, le)
	}
	go func() { _, _ = b.Acquire(ctx, sem, permitOf(3, 30*time.Second)) }()
	go func() { _, _ = a.Acquire(ctx, sem, &dlock.AcquireOptions{TTL: 30 * time.Second}) }()
	queueLen(t, admin, sem, 5)
	info, err := a.Inspect(t.Context(), sem)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || !info.Shared || info.Permits != 3 || len(info.Holders) != 3 || info.Waiters != 2 {
		t.Fatalf("Inspect of a full semaphore of 3 with 2 waiters: %+v", info)
	}
	for i, h := range info.Holders {
		if h.Token != held[i].Token() || h.Holder != fmt.Sprintf("permit-%d", i) || h.TTL <= 0 || h.TTL > 30*time.Second {
			t.Errorf("holder %d: %+v; want token %d, permit-%d, a TTL within 30s", i, h, held[i].Token(), i)
		}
	}
	if info.Token != held[0].Token() || info.Holder != "permit-0" || info.TTL != info.Holders[0].TTL {
		t.Errorf("Inspect's Token/Holder/TTL %d/%q/%v are not those of the oldest holder %+v", info.Token, info.Holder, info.TTL, info.Holders[0])
	}

	rw := uniqueKey(t)
	var readers []*dlock.Lease
	for i := range 2 {
		o := permitOf(0, 30*time.Second)
		o.Holder = fmt.Sprintf("reader-%d", i)
		le, err := a.Acquire(t.Context(), rw, o)
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, le)
	}
	go func() { _, _ = b.Acquire(ctx, rw, &dlock.AcquireOptions{TTL: 30 * time.Second}) }()
	queueLen(t, admin, rw, 3)
	go func() { _, _ = b.Acquire(ctx, rw, permitOf(0, 30*time.Second)) }()
	queueLen(t, admin, rw, 4)
	info, err = b.Inspect(t.Context(), rw)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || !info.Shared || info.Permits != 0 || len(info.Holders) != 2 || info.Waiters != 2 ||
		info.Holders[0].Token != readers[0].Token() || info.Holders[1].Token != readers[1].Token() || info.Holders[1].Holder != "reader-1" {
		t.Fatalf("Inspect of two readers, a writer and a reader waiting: %+v", info)
	}
	keys, err := driver.Keys(t.Context(), a, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(keys, sem) || !slices.Contains(keys, rw) {
		t.Errorf("Keys = %v; want %q and %q among them", keys, sem, rw)
	}
	cancel()
	for _, le := range append(held, readers...) {
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedCancelLeavesNothing: shared waiters cancelled in each of the
// ways a shared waiter waits (the first waiter of a semaphore, one behind
// another waiter, one behind a writer, a reader behind a writer) leave no
// entry in the queue once the holders have gone, and no directory watch.
func TestSharedCancelLeavesNothing(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	h := newLocker(t, eps, nil)
	d, err := etcd.NewDriver(t.Context(), newClient(t, eps), nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := driver.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	for _, c := range []struct {
		name    string
		holders []*dlock.AcquireOptions
		waiters []*dlock.AcquireOptions // all cancelled together
	}{
		{"the first waiter of a semaphore", []*dlock.AcquireOptions{permitOf(2, time.Minute), permitOf(2, time.Minute)}, []*dlock.AcquireOptions{permitOf(2, time.Minute)}},
		{"waiters behind waiters", []*dlock.AcquireOptions{permitOf(1, time.Minute)}, []*dlock.AcquireOptions{permitOf(1, time.Minute), permitOf(1, time.Minute), permitOf(1, time.Minute)}},
		{"permits behind a writer", []*dlock.AcquireOptions{{TTL: time.Minute}}, []*dlock.AcquireOptions{permitOf(2, time.Minute), permitOf(2, time.Minute), permitOf(2, time.Minute)}},
		{"readers behind a writer", []*dlock.AcquireOptions{{TTL: time.Minute}}, []*dlock.AcquireOptions{permitOf(0, time.Minute), permitOf(0, time.Minute)}},
	} {
		key := uniqueKey(t)
		var held []*dlock.Lease
		for _, o := range c.holders {
			le, err := h.Acquire(t.Context(), key, o)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			held = append(held, le)
		}
		ctx, cancel := context.WithCancel(t.Context())
		errs := make(chan error, len(c.waiters))
		for _, o := range c.waiters {
			go func() {
				_, err := w.Acquire(ctx, key, o)
				errs <- err
			}()
		}
		queueLen(t, admin, key, len(c.holders)+len(c.waiters))
		time.Sleep(100 * time.Millisecond) // let them wait
		cancel()
		for range c.waiters {
			if err := <-errs; !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
				t.Errorf("%s: cancelled waiter: %v; want ErrNotAcquired and context.Canceled", c.name, err)
			}
		}
		for _, le := range held {
			if err := le.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		hn := &harness{admin: admin}
		deadline := time.Now().Add(5 * time.Second)
		for {
			res, err := hn.Residue(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			if !res {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the queue still has %d entries after the waiters were cancelled and the holders released", c.name, entries(t, admin, key))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if n := dirWatches(d); n != 0 {
			t.Errorf("%s: %d directory watches left", c.name, n)
		}
	}
}

// serverCounts reads the request counters of the member at addr: the
// unary gRPC requests it handled by method (Range, Txn, LeaseGrant, ...),
// the messages its streams received by method (LeaseKeepAlive, Watch),
// and its committed Raft proposals ("raft").
func serverCounts(ctx context.Context, addr string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	counts := map[string]float64{}
	label := func(s, name string) string {
		_, v, ok := strings.Cut(s, name+`="`)
		if !ok {
			return ""
		}
		v, _, _ = strings.Cut(v, `"`)
		return v
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		switch name, labels, _ := strings.Cut(line[:i], "{"); name {
		case "grpc_server_handled_total":
			if label(labels, "grpc_type") == "unary" {
				counts[label(labels, "grpc_method")] += v
			}
		case "grpc_server_msg_received_total":
			if t := label(labels, "grpc_type"); t == "bidi_stream" {
				counts[label(labels, "grpc_method")] += v
			}
		case "etcd_server_proposals_committed_total":
			counts["raft"] += v
		}
	}
	return counts, sc.Err()
}

// TestSemaphoreDrain: 1,000 waiters on 4 Lockers queue for a semaphore of
// 4, each holding its permit briefly: all are served, never more than 4
// at once. It logs what the grants cost the server, read from its metrics
// (requests by method, stream messages, Raft commits), per grant: a
// release wakes one waiter, whose grant wakes the next (no herd), so the
// cost per grant does not grow with the queue.
func TestSemaphoreDrain(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, 1) // its metrics are this test's alone
	eps := c.Endpoints()
	const waiters, n = 1000, 4
	ls := lockers(t, eps, 4)
	key := uniqueKey(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	before, err := serverCounts(ctx, eps[0])
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg         sync.WaitGroup
		busy, most atomic.Int32
	)
	start := time.Now()
	for i := range waiters {
		wg.Go(func() {
			le, err := ls[i%len(ls)].Acquire(ctx, key, permitOf(n, time.Minute))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			b := busy.Add(1)
			if b > n {
				t.Errorf("%d permits of %d in use at once", b, n)
			}
			for m := most.Load(); b > m && !most.CompareAndSwap(m, b); m = most.Load() {
			}
			time.Sleep(time.Millisecond)
			busy.Add(-1)
			if err := le.Release(ctx); err != nil {
				t.Errorf("waiter %d: Release: %v", i, err)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	after, err := serverCounts(ctx, eps[0])
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	total := 0.0
	for m, v := range after {
		if d := v - before[m]; d > 0 {
			names = append(names, m)
			if m != "raft" {
				total += d
			}
		}
	}
	slices.Sort(names)
	var b strings.Builder
	for _, m := range names {
		fmt.Fprintf(&b, " %s %.2f", m, (after[m]-before[m])/waiters)
	}
	t.Logf("%d waiters on %d Lockers drained a semaphore of %d in %v (at most %d at once)", waiters, len(ls), n, took.Round(time.Millisecond), most.Load())
	t.Logf("server requests and stream messages per grant, from the member's metrics: %.2f in all;%s", total/waiters, b.String())
	if l := entries(t, newClient(t, eps), key); l != 0 {
		t.Errorf("%d entries left in the queue", l)
	}
}

// TestSemaphoreWaiterRefresh: a permit granted after waiting, to a waiter
// that wrote its key to wake the waiter behind it, can be refreshed to
// another TTL (which moves the key to a new lease, on condition that the
// key is unchanged since our last write to it) and released; the waiter
// behind it is granted in turn.
func TestSemaphoreWaiterRefresh(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	a, b := newLocker(t, eps, nil), newLocker(t, eps, nil)
	key := uniqueKey(t)
	h, err := a.Acquire(t.Context(), key, permitOf(1, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		le  *dlock.Lease
		err error
	}
	first, second := make(chan got, 1), make(chan got, 1)
	go func() {
		le, err := b.Acquire(t.Context(), key, permitOf(1, 30*time.Second))
		first <- got{le, err}
	}()
	queueLen(t, admin, key, 2)
	go func() {
		le, err := a.Acquire(t.Context(), key, permitOf(1, 30*time.Second))
		second <- got{le, err}
	}()
	queueLen(t, admin, key, 3)
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	g := <-first
	if g.err != nil {
		t.Fatal(g.err)
	}
	if err := g.le.Refresh(t.Context(), 20*time.Second); err != nil {
		t.Fatalf("Refresh to another TTL of a permit granted after waiting: %v", err)
	}
	select {
	case s := <-second:
		t.Fatalf("a second permit of 1 was granted: %v", s.err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := g.le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	s := <-second
	if s.err != nil {
		t.Fatal(s.err)
	}
	if err := s.le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
