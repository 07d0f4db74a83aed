package redlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// countNodes counts the nodes on which f holds, polling each once.
func countNodes(admin []goredis.UniversalClient, f func(goredis.UniversalClient) bool) int {
	n := 0
	for _, c := range admin {
		if f(c) {
			n++
		}
	}
	return n
}

// waitFor polls cond every 5ms until it holds or within passes, and reports
// whether it held.
func waitFor(within time.Duration, cond func() bool) bool {
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestWaiterWokenByRelease: a waiting Acquire is woken by the holder's
// release, well before its poll interval (RetryMin = RetryMax = 5s, so a
// poll comes no sooner than 2.5s after an attempt), and the Locker reports
// WakesWaiters.
func TestWaiterWokenByRelease(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	admin := clients(t, a)
	newLocker := func(lo *dlock.Options) *dlock.Locker {
		l, err := redlock.New(t.Context(), clients(t, a), &redlock.Options{NodeTimeout: testNodeTimeout, Locker: lo})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	const poll = 5 * time.Second
	holder, waiter := newLocker(nil), newLocker(&dlock.Options{RetryMin: poll, RetryMax: poll})
	if !waiter.Guarantees().WakesWaiters {
		t.Errorf("Guarantees().WakesWaiters = false; want true")
	}
	key := uniqueKey(t)
	lk := lockKey(key)
	quorum := len(a)/2 + 1
	// The holder's TTL is far beyond the test: only its release can end
	// the wait in time.
	lh, err := holder.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		le  *dlock.Lease
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		le, err := waiter.Acquire(ctx, key, &dlock.AcquireOptions{TTL: 10 * time.Second})
		got <- result{le, err, time.Now()}
	}()
	marked := func(c goredis.UniversalClient) bool {
		v, err := c.Get(t.Context(), lk).Result()
		return err == nil && strings.HasSuffix(v, "+")
	}
	// The waiter's first attempt marks the lock as waited for.
	if !waitFor(10*time.Second, func() bool { return countNodes(admin, marked) >= quorum }) {
		t.Fatal("the waiter's attempt never marked the lock on a majority")
	}
	// It then subscribes to the release channel on a majority.
	subscribed := func(c goredis.UniversalClient) bool {
		n, err := c.PubSubNumSub(t.Context(), lk+":released").Result()
		return err == nil && n[lk+":released"] > 0
	}
	if !waitFor(5*time.Second, func() bool { return countNodes(admin, subscribed) >= quorum }) {
		t.Errorf("the waiter did not subscribe to the release channel on a majority")
	}
	// Take the marks off and wait for the waiter's next attempt to put
	// them back: it has just tried, and sleeps at least poll/2 unless
	// woken.
	for _, c := range admin {
		if v, err := c.Get(t.Context(), lk).Result(); err == nil && strings.HasSuffix(v, "+") {
			if err := c.SetArgs(t.Context(), lk, strings.TrimSuffix(v, "+"), goredis.SetArgs{Mode: "XX", KeepTTL: true}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !waitFor(2*poll, func() bool { return countNodes(admin, marked) >= quorum }) {
		t.Fatal("the waiter made no attempt within two poll intervals")
	}
	released := time.Now()
	if err := lh.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("Acquire after the release: %v", r.err)
	}
	defer r.le.Release(context.WithoutCancel(t.Context()))
	handoff := r.at.Sub(released)
	t.Logf("handoff %v after the release (poll interval %v)", handoff.Round(time.Millisecond), poll)
	if handoff > 2*time.Second {
		t.Errorf("the waiter got the lock %v after the release; want it woken (within 2s), not polling every %v", handoff.Round(time.Millisecond), poll)
	}
	if r.le.Token() <= lh.Token() {
		t.Errorf("token %d after %d; want it larger", r.le.Token(), lh.Token())
	}
}

// TestWatchReportsRelease: the driver's Watch (backend.Waiter) reports a
// release that happens after Watch returned and an attempt found the key
// held.
func TestWatchReportsRelease(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	d, err := redlock.NewDriver(t.Context(), clients(t, a), &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	checkWatch(t, d)
}

// checkWatch takes key with d, watches it, and requires the release to
// wake the watcher.
func checkWatch(t *testing.T, d *redlock.Driver) {
	t.Helper()
	w, ok := any(d).(backend.Waiter)
	if !ok {
		t.Fatal("*redlock.Driver does not implement backend.Waiter")
	}
	key := uniqueKey(t)
	held, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	wake, stop, err := w.Watch(t.Context(), key)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer stop()
	t.Logf("Watch returned after %v", time.Since(begin).Round(time.Millisecond))
	if _, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire of the held key = %v, want ErrNotAcquired", err)
	}
	select {
	case <-wake:
		t.Fatal("woken before the release")
	default:
	}
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(5 * time.Second):
		t.Fatal("no wake-up within 5s of the release")
	}
}

// TestWatchSubscribedOnQuorum: when Watch returns, a majority of the nodes
// has the subscription (PUBSUB NUMSUB), so that a release right after it is
// published to a subscriber. Fresh Drivers (the first Watch opens the
// pub/sub connections) and further watches on the same Driver, in a loop:
// a Watch that returned early would lose the race often, not always.
func TestWatchSubscribedOnQuorum(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	admin := clients(t, a)
	quorum := len(a)/2 + 1
	for range 10 {
		d, err := redlock.NewDriver(t.Context(), clients(t, a), &redlock.Options{NodeTimeout: testNodeTimeout})
		if err != nil {
			t.Fatal(err)
		}
		w := any(d).(backend.Waiter)
		for range 4 {
			key := uniqueKey(t)
			channel := lockKey(key) + ":released"
			_, stop, err := w.Watch(t.Context(), key)
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			n := countNodes(admin, func(c goredis.UniversalClient) bool {
				m, err := c.PubSubNumSub(t.Context(), channel).Result()
				return err == nil && m[channel] > 0
			})
			stop()
			if n < quorum {
				t.Errorf("right after Watch returned, %d of %d nodes had the subscription; want at least %d", n, len(a), quorum)
			}
		}
		_ = d.Close()
	}
}

// TestWatchMinorityFrozen: with two of five nodes frozen, Watch returns
// once a majority has confirmed (well before the frozen nodes could
// answer), the release still wakes the watcher, and Close does not wait
// for the frozen nodes' pub/sub connections.
func TestWatchMinorityFrozen(t *testing.T) {
	t.Parallel()
	ss := fiveNodes(t)
	d, err := redlock.NewDriver(t.Context(), clients(t, addrs(ss)), &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		begin := time.Now()
		_ = d.Close()
		took := time.Since(begin)
		t.Logf("Close with 2 of 5 frozen took %v", took.Round(time.Millisecond))
		// Close waits for a frozen node's pub/sub connection at most 2s
		// (go-redis would hold it for tens of seconds).
		// 4s leaves room for a loaded machine, not for a Close that
		// waits for go-redis.
		if took > 4*time.Second {
			t.Errorf("Close with 2 of 5 frozen took %v; want it bounded by about 2s", took.Round(time.Millisecond))
		}
	}()
	for _, s := range ss[3:] {
		if err := s.Pause(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range ss[3:] {
			_ = s.Unpause(context.WithoutCancel(t.Context()))
		}
	})
	checkWatch(t, d)
}

// TestWatchMajorityFrozen: with three of five nodes frozen, Watch fails
// with ErrUnavailable, within a bounded time, rather than waiting for the
// caller's context.
func TestWatchMajorityFrozen(t *testing.T) {
	t.Parallel()
	ss := fiveNodes(t)
	d, err := redlock.NewDriver(t.Context(), clients(t, addrs(ss)), &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	w, ok := any(d).(backend.Waiter)
	if !ok {
		t.Fatal("*redlock.Driver does not implement backend.Waiter")
	}
	for _, s := range ss[2:] {
		if err := s.Pause(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range ss[2:] {
			_ = s.Unpause(context.WithoutCancel(t.Context()))
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	begin := time.Now()
	_, stop, err := w.Watch(ctx, uniqueKey(t))
	took := time.Since(begin)
	if err == nil {
		stop()
		t.Fatal("Watch with 3 of 5 frozen succeeded")
	}
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("Watch with 3 of 5 frozen = %v, want ErrUnavailable", err)
	}
	if took > 10*time.Second {
		t.Errorf("Watch took %v to fail; want it bounded (not the caller's minute)", took)
	}
	t.Logf("3 of 5 frozen: %v after %v", err, took.Round(time.Millisecond))
}
