package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redis"
)

// The tests of shared leases (issue 24): semaphore permits and readers'
// leases of read-write locks, on the single-Redis backend.

// lockers returns n Lockers on the test server, each with its own client,
// as n processes would have; they are closed at the end of the test.
func lockers(t *testing.T, n int, opts *dlock.Options) []*dlock.Locker {
	t.Helper()
	addr := serverAddr(t)
	ls := make([]*dlock.Locker, n)
	for i := range ls {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		l, err := redis.New(t.Context(), c, &redis.Options{Locker: opts})
		if err != nil {
			_ = c.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = l.Close()
			_ = c.Close()
		})
		ls[i] = l
	}
	return ls
}

// sharedValue returns the lock value of key on the server ("" when the
// key is free).
func sharedValue(t *testing.T, admin *goredis.Client, key string) string {
	t.Helper()
	v, err := admin.Get(t.Context(), lockKey(key)).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		t.Fatal(err)
	}
	return v
}

// writerWaits reports whether key's lock value is that of shared holders
// with a writer's time in it (acquire.lua, a waiting writer's attempt).
func writerWaits(v string) bool {
	body, ok := strings.CutPrefix(v, "\x00s")
	if !ok {
		return false
	}
	_, until, _ := strings.Cut(strings.TrimSuffix(body, "+"), ":")
	return until != "" && until != "0"
}

// eventually polls cond every 5ms until it holds, and fails t if it does
// not within 20s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 20s", what)
		}
	}
}

// TestSharedSemaphoreBound: many goroutines on several Lockers take
// permits of one semaphore of N, and never more than N of them are inside
// the critical section at once (an atomic count of holders, checked inside
// it); every permit asked for is granted.
func TestSharedSemaphoreBound(t *testing.T) {
	t.Parallel()
	const (
		permits    = 3
		goroutines = 24
		rounds     = 15
	)
	ls := lockers(t, 4, nil)
	key := uniqueKey(t)
	var inside, most, grants atomic.Int64
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		l := ls[g%len(ls)]
		wg.Go(func() {
			for range rounds {
				le, err := l.Acquire(ctx, key, &dlock.AcquireOptions{Permits: permits, TTL: 20 * time.Second})
				if err != nil {
					errs <- err
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				grants.Add(1)
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				inside.Add(-1)
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
	if m := most.Load(); m > permits {
		t.Errorf("%d holders inside the critical section at once; the semaphore has %d permits", m, permits)
	}
	if g := grants.Load(); g != goroutines*rounds {
		t.Errorf("%d grants, want %d", g, goroutines*rounds)
	}
	t.Logf("%d grants, at most %d holders at once (permits %d)", grants.Load(), most.Load(), permits)
}

// TestSharedReadersOverlapWriterExcludes: readers hold together; a writer
// (a plain acquire) is refused while they hold and excludes them while it
// holds; a semaphore's key is exclusive to a plain acquire too.
func TestSharedReadersOverlapWriterExcludes(t *testing.T) {
	t.Parallel()
	ls := lockers(t, 3, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	reader := &dlock.AcquireOptions{Shared: true}

	r1, err := ls[0].TryAcquire(ctx, key, reader)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ls[1].TryAcquire(ctx, key, reader)
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if _, err := ls[2].TryAcquire(ctx, key, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a writer while two readers hold: %v, want ErrNotAcquired", err)
	}
	// A writer's TryAcquire does not keep readers out (Request.Wait 0).
	r3, err := ls[2].TryAcquire(ctx, key, reader)
	if err != nil {
		t.Fatalf("a third reader after a writer's TryAcquire: %v", err)
	}
	for _, r := range []*dlock.Lease{r1, r2, r3} {
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := ls[2].TryAcquire(ctx, key, nil)
	if err != nil {
		t.Fatalf("the writer once the readers left: %v", err)
	}
	if _, err := ls[0].TryAcquire(ctx, key, reader); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a reader while the writer holds: %v, want ErrNotAcquired", err)
	}
	if _, err := ls[0].TryAcquire(ctx, key, &dlock.AcquireOptions{Permits: 2}); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a permit while the writer holds: %v, want ErrNotAcquired", err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A semaphore of 2: two permits, then a plain acquire waits for both.
	sem := &dlock.AcquireOptions{Permits: 2}
	p1 := acquireOK(t, ls[0], key, sem)
	p2 := acquireOK(t, ls[1], key, sem)
	if _, err := ls[2].TryAcquire(ctx, key, sem); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a third permit of 2: %v, want ErrNotAcquired", err)
	}
	got := make(chan error, 1)
	go func() {
		le, err := ls[2].Acquire(ctx, key, nil)
		if err == nil {
			err = le.Release(ctx)
		}
		got <- err
	}()
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		t.Fatalf("the plain acquire returned (%v) while a permit was still held", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := p2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the plain acquire did not get the key within 20s of the last permit's release")
	}
}

func acquireOK(t *testing.T, l *dlock.Locker, key string, o *dlock.AcquireOptions) *dlock.Lease {
	t.Helper()
	le, err := l.TryAcquire(t.Context(), key, o)
	if err != nil {
		t.Fatal(err)
	}
	return le
}

// TestSharedWaitingWriterBlocksReaders: a writer that waits for readers
// keeps new readers out; when the last reader leaves, the key is reserved
// for writers (a reader is refused, any writer takes it); the writer gets
// the key.
func TestSharedWaitingWriterBlocksReaders(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	ls := lockers(t, 3, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	reader := &dlock.AcquireOptions{Shared: true}

	r1 := acquireOK(t, ls[0], key, reader)
	got := make(chan error, 1)
	var wl atomic.Pointer[dlock.Lease]
	go func() {
		le, err := ls[1].Acquire(ctx, key, nil)
		wl.Store(le)
		got <- err
	}()
	eventually(t, "the writer's mark", func() bool { return writerWaits(sharedValue(t, admin, key)) })
	if _, err := ls[2].TryAcquire(ctx, key, reader); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a new reader while a writer waits: %v, want ErrNotAcquired", err)
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the writer did not get the key within 20s of the last reader's release")
	}
	if _, err := ls[2].TryAcquire(ctx, key, reader); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a reader while the writer holds: %v, want ErrNotAcquired", err)
	}
	if err := wl.Load().Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSharedReservation drives the writer's reservation through the
// Driver: a waiting writer's attempt (Request.Wait) finds a reader and
// marks the key; the reader's release leaves the key reserved for writers;
// a reader is refused, a writer's TryAcquire (any writer) takes it, marked
// for the refused reader's sake, whose watch then hears the writer's
// release.
func TestSharedReservation(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	read := backend.Request{Key: key, TTL: 10 * time.Second, Shared: true}

	r, err := d.TryAcquire(ctx, read)
	if err != nil {
		t.Fatal(err)
	}
	var held *backend.HeldError
	if _, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: 10 * time.Second, Wait: 5 * time.Second}); !errors.As(err, &held) {
		t.Fatalf("a waiting writer's attempt: %v, want a HeldError", err)
	}
	if held.RetryAfter <= 9*time.Second || held.RetryAfter > 10*time.Second {
		t.Errorf("the writer's RetryAfter %v, want about the reader's 10s", held.RetryAfter)
	}
	if v := sharedValue(t, c, key); !writerWaits(v) {
		t.Fatalf("lock value %q after the writer's attempt: no writer's time", v)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	v := sharedValue(t, c, key)
	if !strings.HasPrefix(v, "\x00w") {
		t.Fatalf("lock value %q after the last reader's release while a writer waits: not a reservation", v)
	}
	if pttl := c.PTTL(ctx, lockKey(key)).Val(); pttl <= 0 || pttl > 5*time.Second {
		t.Errorf("reservation PTTL %v, want within the writer's 5s", pttl)
	}
	if n := c.Exists(ctx, lockKey(key)+":holders", lockKey(key)+":tokens").Val(); n != 0 {
		t.Errorf("%d holders or tokens keys left with the reservation", n)
	}
	info, err := d.Inspect(ctx, key)
	if err != nil || info.Held {
		t.Errorf("Inspect of a reservation: %+v, %v; want free", info, err)
	}
	wake, stop, err := d.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, err := d.TryAcquire(ctx, read); !errors.As(err, &held) {
		t.Fatalf("a reader on a reservation: %v, want a HeldError", err)
	}
	w, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("a writer's TryAcquire on a reservation: %v", err)
	}
	if v := sharedValue(t, c, key); !strings.HasSuffix(v, "+") || strings.HasPrefix(v, "\x00") {
		t.Errorf("the writer's lock value %q: want a grant's value, marked", v)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(20 * time.Second):
		t.Fatal("the reader's watch did not hear the writer's release")
	}
	if _, err := d.TryAcquire(ctx, read); err != nil {
		t.Fatalf("a reader after the writer: %v", err)
	}
}

// TestSharedWriterNotStarved: readers on two Lockers overlap without a
// pause (the read lock is practically never free), yet a writer gets the
// key: its waiting attempts keep new readers out until the readers in
// have left.
func TestSharedWriterNotStarved(t *testing.T) {
	t.Parallel()
	ls := lockers(t, 3, nil)
	key := uniqueKey(t)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var reads atomic.Int64
	var writing atomic.Bool
	var overlap atomic.Bool
	for g := range 8 {
		l := ls[g%2]
		wg.Go(func() {
			for ctx.Err() == nil {
				le, err := l.Acquire(ctx, key, &dlock.AcquireOptions{Shared: true, TTL: 20 * time.Second})
				if err != nil {
					return
				}
				if writing.Load() {
					overlap.Store(true)
				}
				reads.Add(1)
				time.Sleep(time.Duration(40+rand.IntN(40)) * time.Millisecond)
				_ = le.Release(context.WithoutCancel(ctx))
			}
		})
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	eventually(t, "readers", func() bool { return reads.Load() > 20 })
	// Without the writer's mark the readers, 8 of them each holding 40
	// to 80ms, would leave the key free too seldom for it (seen: the
	// writer still waiting after 15s).
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	start := time.Now()
	w, err := ls[2].Acquire(wctx, key, &dlock.AcquireOptions{TTL: 20 * time.Second})
	if err != nil {
		t.Fatalf("the writer, among %d reads so far: %v", reads.Load(), err)
	}
	writing.Store(true)
	time.Sleep(50 * time.Millisecond)
	writing.Store(false)
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if overlap.Load() {
		t.Error("a reader held while the writer did")
	}
	t.Logf("the writer got the key after %v, among %d reads", time.Since(start), reads.Load())
}

// TestSharedPermitsMismatch: a shared request whose Permits differ from
// the key's holders' fails at once with a *PermitsError (also a waiting
// Acquire), taking nothing and marking nothing.
func TestSharedPermitsMismatch(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	ls := lockers(t, 2, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	p := acquireOK(t, ls[0], key, &dlock.AcquireOptions{Permits: 4})
	before := sharedValue(t, admin, key)
	for _, tc := range []struct {
		name string
		o    *dlock.AcquireOptions
		want dlock.PermitsError
	}{
		{"3 of 4", &dlock.AcquireOptions{Permits: 3}, dlock.PermitsError{Asked: 3, Held: 4}},
		{"reader of 4", &dlock.AcquireOptions{Shared: true}, dlock.PermitsError{Asked: 0, Held: 4}},
	} {
		for _, wait := range []bool{false, true} {
			start := time.Now()
			var err error
			if wait {
				_, err = ls[1].Acquire(ctx, key, tc.o)
			} else {
				_, err = ls[1].TryAcquire(ctx, key, tc.o)
			}
			var pe *dlock.PermitsError
			if !errors.As(err, &pe) || *pe != tc.want || !errors.Is(err, dlock.ErrInvalidConfig) || errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("%s (wait %v): %v; want %+v, matching ErrInvalidConfig only", tc.name, wait, err, tc.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("%s (wait %v): returned after %v; want at once", tc.name, wait, d)
			}
		}
	}
	if after := sharedValue(t, admin, key); after != before {
		t.Errorf("the lock value went from %q to %q: the refused requests wrote", before, after)
	}
	info, err := ls[0].Inspect(ctx, key)
	if err != nil || len(info.Holders) != 1 || info.Permits != 4 {
		t.Errorf("Inspect after the refusals: %+v, %v; want the one permit of 4", info, err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Free again: the first holder sets the number.
	acquireOK(t, ls[1], key, &dlock.AcquireOptions{Permits: 3})
}

// TestSharedTokensIncrease: tokens strictly increase over all grants on a
// key, exclusive and shared, overlapping or not, whichever Locker grants.
func TestSharedTokensIncrease(t *testing.T) {
	t.Parallel()
	ls := lockers(t, 3, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	var last dlock.Token
	take := func(i int, o *dlock.AcquireOptions) *dlock.Lease {
		t.Helper()
		le := acquireOK(t, ls[i%len(ls)], key, o)
		if le.Token() <= last {
			t.Fatalf("grant %d (%+v): token %d, not above the previous %d", i, o, le.Token(), last)
		}
		last = le.Token()
		return le
	}
	release := func(les ...*dlock.Lease) {
		t.Helper()
		for _, le := range les {
			if err := le.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	i := 0
	for range 5 {
		release(take(i, nil))
		i++
		var rs []*dlock.Lease
		for range 3 {
			rs = append(rs, take(i, &dlock.AcquireOptions{Shared: true}))
			i++
		}
		release(rs[0])
		rs = append(rs[1:], take(i, &dlock.AcquireOptions{Shared: true})) // overlapping the others
		i++
		release(rs...)
		p := take(i, &dlock.AcquireOptions{Permits: 2})
		i++
		q := take(i, &dlock.AcquireOptions{Permits: 2})
		i++
		release(p, q)
	}
}

// TestSharedInspect: Inspect lists every valid lease, oldest grant first,
// with its token, TTL and holder, and Shared and Permits; Keys lists the
// key while it is held; an exclusive lease is the one holder.
func TestSharedInspect(t *testing.T) {
	t.Parallel()
	ls := lockers(t, 3, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	var les []*dlock.Lease
	for i, h := range []string{"a", "b", "c"} {
		les = append(les, acquireOK(t, ls[i], key, &dlock.AcquireOptions{Permits: 3, Holder: h, TTL: time.Duration(10+i) * time.Second}))
	}
	info, err := ls[0].Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || !info.Shared || info.Permits != 3 || len(info.Holders) != 3 || info.Waiters != -1 {
		t.Fatalf("Inspect: %+v; want 3 shared holders of 3 permits", info)
	}
	for i, h := range info.Holders {
		if h.Token != les[i].Token() || h.Holder != string(rune('a'+i)) {
			t.Errorf("Holders[%d] = %+v; want token %d, holder %q", i, h, les[i].Token(), string(rune('a'+i)))
		}
		if ttl := time.Duration(10+i) * time.Second; h.TTL <= ttl-5*time.Second || h.TTL > ttl {
			t.Errorf("Holders[%d].TTL = %v, want a little under %v", i, h.TTL, ttl)
		}
	}
	if h := info.Holders[0]; info.Token != h.Token || info.TTL != h.TTL || info.Holder != h.Holder {
		t.Errorf("top-level Token %d, TTL %v, Holder %q; want Holders[0]'s %+v", info.Token, info.TTL, info.Holder, h)
	}
	keys, err := driver.Keys(ctx, ls[0], 1_000_000)
	if err != nil || !slices.Contains(keys, key) {
		t.Errorf("Keys: %v (%d keys); want %q among them", err, len(keys), key)
	}
	if err := les[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	info, _ = ls[0].Inspect(ctx, key)
	if len(info.Holders) != 2 || info.Holders[0].Token != les[0].Token() || info.Holders[1].Token != les[2].Token() {
		t.Errorf("Inspect after the middle release: %+v", info)
	}
	for _, le := range []*dlock.Lease{les[0], les[2]} {
		if err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	info, err = ls[0].Inspect(ctx, key)
	if err != nil || info.Held || info.Shared || len(info.Holders) != 0 {
		t.Errorf("Inspect after every release: %+v, %v; want free", info, err)
	}
	keys, _ = driver.Keys(ctx, ls[0], 1_000_000)
	if slices.Contains(keys, key) {
		t.Errorf("Keys lists %q after every release", key)
	}

	x := acquireOK(t, ls[0], key, &dlock.AcquireOptions{Holder: "x"})
	info, _ = ls[0].Inspect(ctx, key)
	if !info.Held || info.Shared || len(info.Holders) != 1 || info.Holders[0].Token != x.Token() || info.Holders[0].Holder != "x" {
		t.Errorf("Inspect of an exclusive lease: %+v; want it as the one holder", info)
	}
}

// TestSharedExpiry: a shared lease that is not refreshed expires by the
// server's clock: its permit is free again, and its Refresh and Release
// find it gone.
func TestSharedExpiry(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	sem := backend.Request{Key: key, TTL: 300 * time.Millisecond, Shared: true, Permits: 1}
	old, err := d.TryAcquire(ctx, sem)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, sem); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("a second permit of 1: %v", err)
	}
	time.Sleep(400 * time.Millisecond)
	sem.TTL = 10 * time.Second
	nl, err := d.TryAcquire(ctx, sem)
	if err != nil {
		t.Fatalf("the permit after the first one's TTL: %v", err)
	}
	if _, err := old.Refresh(ctx, time.Second); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh of the expired lease: %v, want ErrNotHeld", err)
	}
	if err := old.Release(ctx); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release of the expired lease: %v, want ErrNotHeld", err)
	}
	if got, err := nl.Refresh(ctx, 20*time.Second); err != nil || got != 20*time.Second {
		t.Fatalf("Refresh of the valid lease: %v, %v", got, err)
	}
	if pttl := c.PTTL(ctx, lockKey(key)).Val(); pttl <= 10*time.Second {
		t.Errorf("lock key PTTL %v after the refresh to 20s: it must follow the last holder", pttl)
	}
	if err := nl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, sharedKeys(key)...).Val(); n != 0 {
		t.Errorf("%d keys left after the last release", n)
	}
}

// TestSharedHarnessExpire: the harness's Expire drops every lease on the
// key (as memory.Store.Expire does), and leaves nothing behind.
func TestSharedHarnessExpire(t *testing.T) {
	t.Parallel()
	h := &harness{admin: goredis.NewClient(&goredis.Options{Addr: serverAddr(t)})}
	defer h.Close()
	ls := lockers(t, 3, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	var les []*dlock.Lease
	for _, l := range ls {
		les = append(les, acquireOK(t, l, key, &dlock.AcquireOptions{Permits: 3}))
	}
	if err := h.Expire(ctx, key); err != nil {
		t.Fatal(err)
	}
	for i, le := range les {
		if err := le.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrLeaseLost) {
			t.Errorf("lease %d after Expire: Refresh %v, want ErrNotHeld", i, err)
		}
	}
	if left, err := h.Residue(ctx, key); err != nil || left {
		t.Errorf("Residue after Expire: %v, %v", left, err)
	}
}

// TestSharedCancelledWaiterLeavesNothing: a shared waiter (a permit of a
// full semaphore) and a writer waiting for readers, both cancelled while
// queued, leave nothing on the server once the holders have gone: no
// key, no holders, no subscription (the writer's reservation ends with its
// time).
func TestSharedCancelledWaiterLeavesNothing(t *testing.T) {
	t.Parallel()
	h := &harness{admin: goredis.NewClient(&goredis.Options{Addr: serverAddr(t)})}
	t.Cleanup(h.Close) // after the parallel subtests
	for _, tc := range []struct {
		name         string
		held, waiter *dlock.AcquireOptions
	}{
		{"permit", &dlock.AcquireOptions{Permits: 1}, &dlock.AcquireOptions{Permits: 1}},
		{"writer", &dlock.AcquireOptions{Shared: true}, nil},
		{"reader behind a holding writer", nil, &dlock.AcquireOptions{Shared: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ls := lockers(t, 2, nil)
			key := uniqueKey(t)
			holder := acquireOK(t, ls[0], key, tc.held)
			ctx, cancel := context.WithCancel(t.Context())
			got := make(chan error, 1)
			go func() {
				le, err := ls[1].Acquire(ctx, key, tc.waiter)
				if err == nil {
					_ = le.Release(t.Context())
				}
				got <- err
			}()
			// Queued: it has marked the key and watches its channel.
			eventually(t, "the waiter's watch", func() bool {
				ch := lockKey(key) + ":released"
				m, err := h.admin.PubSubNumSub(t.Context(), ch).Result()
				return err == nil && m[ch] > 0 && strings.HasSuffix(sharedValue(t, h.admin, key), "+")
			})
			cancel()
			select {
			case err := <-got:
				if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
					t.Fatalf("the cancelled waiter: %v, want ErrNotAcquired and context.Canceled", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the cancelled waiter did not return within 20s")
			}
			if err := holder.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			eventually(t, "no residue", func() bool {
				left, err := h.Residue(t.Context(), key)
				return err == nil && !left
			})
		})
	}
}

// TestSharedRefreshBatch: RefreshBatch refreshes shared leases (of two
// keys) and exclusive ones together, each with Refresh's meaning; a
// released shared lease gets ErrNotHeld and is not re-created.
// TestConformanceCluster runs it on a Cluster client too.
func TestSharedRefreshBatch(t *testing.T) {
	t.Parallel()
	c := goredis.NewClient(&goredis.Options{Addr: serverAddr(t)})
	t.Cleanup(func() { _ = c.Close() })
	testSharedRefreshBatch(t, c, serverClient(t))
}

func testSharedRefreshBatch(t *testing.T, c goredis.UniversalClient, admin *goredis.Client) {
	d := newDriver(t, c, nil)
	ctx := t.Context()
	k1, k2, k3 := uniqueKey(t), uniqueKey(t), uniqueKey(t)
	var leases []backend.Lease
	for _, r := range []backend.Request{
		{Key: k1, Shared: true, Permits: 3}, {Key: k1, Shared: true, Permits: 3}, {Key: k3},
		{Key: k2, Shared: true}, {Key: k1, Shared: true, Permits: 3}, {Key: k2, Shared: true},
	} {
		r.TTL = 5 * time.Second
		l, err := d.TryAcquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	const released = 1
	if err := leases[released].Release(ctx); err != nil {
		t.Fatal(err)
	}
	reqs := make([]backend.RefreshRequest, len(leases))
	for i, l := range leases {
		reqs[i] = backend.RefreshRequest{Lease: l, TTL: 30 * time.Second}
	}
	d.RefreshBatch(ctx, reqs)
	for i, r := range reqs {
		if i == released {
			if !errors.Is(r.Err, backend.ErrNotHeld) {
				t.Errorf("released lease %d: %v, want ErrNotHeld", i, r.Err)
			}
			continue
		}
		if r.Err != nil || r.Granted != 30*time.Second {
			t.Errorf("lease %d: Granted %v, Err %v", i, r.Granted, r.Err)
		}
	}
	for _, k := range []string{k1, k2, k3} {
		if pttl := admin.PTTL(ctx, lockKey(k)).Val(); pttl <= 20*time.Second {
			t.Errorf("%s: PTTL %v after the refresh to 30s", k, pttl)
		}
	}
	info, err := d.Inspect(ctx, k1)
	if err != nil || len(info.Holders) != 2 {
		t.Fatalf("Inspect of %s: %+v, %v; want 2 holders", k1, info, err)
	}
	for _, h := range info.Holders {
		if h.TTL <= 20*time.Second {
			t.Errorf("%s holder %+v: TTL not refreshed", k1, h)
		}
	}
	for i, l := range leases {
		if i != released {
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestSharedDrain: 1,000 waiters spread over 5 Lockers drain a semaphore
// of 4, each holding its permit for a millisecond. It must finish with
// every waiter served, never more than 4 inside; the server's commands per
// grant (INFO commandstats before and after: the scripts and pub/sub
// commands the clients sent, and the commands the scripts ran) are
// logged, not asserted. Not parallel: commandstats counts the whole
// server, so no other test of the package runs meanwhile.
func TestSharedDrain(t *testing.T) {
	const (
		waiters = 1000
		permits = 4
		nl      = 5
	)
	admin := serverClient(t)
	ls := lockers(t, nl, nil)
	key := uniqueKey(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	// The Lockers' first commands (HELLO, CLIENT SETINFO) are not the
	// drain's.
	for _, l := range ls {
		if _, err := l.Inspect(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	before := commandStats(t, admin)
	start := time.Now()
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, waiters)
	for i := range waiters {
		l := ls[i%nl]
		wg.Go(func() {
			le, err := l.Acquire(ctx, key, &dlock.AcquireOptions{Permits: permits, TTL: 30 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(time.Millisecond)
			inside.Add(-1)
			if err := le.Release(ctx); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	failed := 0
	for err := range errs {
		if failed++; failed <= 5 {
			t.Error(err)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d waiters failed", failed, waiters)
	}
	if m := most.Load(); m > permits {
		t.Fatalf("%d holders at once; the semaphore has %d permits", m, permits)
	}
	after := commandStats(t, admin)
	delta := map[string]int64{}
	var total, sent int64
	for name, n := range after {
		if d := n - before[name]; d > 0 && name != "info" {
			delta[name] = d
			total += d
		}
	}
	// What the clients sent: the scripts and the pub/sub commands; the
	// rest ran inside the scripts.
	for _, name := range []string{"evalsha", "eval", "subscribe", "unsubscribe", "ping", "script|load", "hello", "client|setinfo"} {
		sent += delta[name]
	}
	names := make([]string, 0, len(delta))
	for name := range delta {
		names = append(names, name)
	}
	slices.Sort(names)
	var per []string
	for _, name := range names {
		per = append(per, fmt.Sprintf("%s %.2f", name, float64(delta[name])/waiters))
	}
	t.Logf("%d grants on a semaphore of %d from %d Lockers in %v (%.0f grants/s), at most %d holders at once",
		waiters, permits, nl, elapsed.Round(time.Millisecond), waiters/elapsed.Seconds(), most.Load())
	t.Logf("server commands per grant (INFO commandstats): %.2f sent by the clients, %.2f in all; by command: %s",
		float64(sent)/waiters, float64(total)/waiters, strings.Join(per, ", "))
}

// commandStats returns INFO commandstats as calls per command.
func commandStats(t *testing.T, c *goredis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats: %q: %v", line, err)
		}
		out[name] = n
	}
	return out
}
