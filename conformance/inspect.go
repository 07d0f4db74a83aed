package conformance

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
)

// InspectCaps says what a backend's Inspect can tell, for [RunInspect].
type InspectCaps struct {
	// Token: Inspect reports the holder's fencing token.
	Token bool
	// TTL: Inspect reports the time left on the holder's lease.
	TTL bool
	// Waiters: Inspect counts the waiters queued on the server (else it
	// reports -1).
	Waiters bool
}

// RunInspect checks Locker.Inspect and driver.Keys on a backend that
// implements backend.Inspector: a free key reads free, a held one reads
// held with the holder's token and a TTL in (0, granted], a queued waiter
// is counted (where caps.Waiters), the holder description given to the
// acquire is returned (and a bad one refused before any I/O), Keys lists a held key, a released key
// reads free again, and bad input is refused with a typed error before any
// I/O.
func RunInspect(t *testing.T, newHarness HarnessMaker, caps InspectCaps) {
	ctx := t.Context()
	h, err := newHarness(ctx, t)
	if err != nil {
		t.Fatalf("making harness: %v", err)
	}
	t.Cleanup(h.Close)
	s := &suite{h: h}
	a, b := s.locker(t), s.locker(t)
	s.lim = a.Limits()

	t.Run("BadInput", func(t *testing.T) {
		for _, k := range []string{"", strings.Repeat("k", dlock.MaxKeyLen+1), "a\x00b"} {
			// A cancelled context: a backend that did I/O first would
			// fail with ErrUnavailable, not ErrInvalidKey.
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			_, err := a.Inspect(cctx, k)
			cancel()
			if !errors.Is(err, dlock.ErrInvalidKey) {
				t.Errorf("Inspect(%q): got %v, want an error matching ErrInvalidKey", k, err)
			}
		}
		if _, err := driver.Keys(ctx, a, 0); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("Keys(0): got %v, want an error matching ErrInvalidConfig", err)
		}
	})

	t.Run("FreeHeldReleased", func(t *testing.T) {
		k := key(t)
		info, err := a.Inspect(ctx, k)
		if err != nil {
			t.Fatalf("Inspect(free %q): %v", k, err)
		}
		if info.Held || info.Token != 0 || info.TTL != 0 {
			t.Errorf("Inspect(free key) = %+v, want not held, no token, no TTL", info)
		}
		ttl := max(10*time.Second, s.lim.MinTTL)
		le := acquire(t, b, k, &dlock.AcquireOptions{TTL: ttl})
		info, err = a.Inspect(ctx, k)
		if err != nil {
			t.Fatalf("Inspect(held %q): %v", k, err)
		}
		if !info.Held {
			t.Fatalf("Inspect(held key) = %+v, want held", info)
		}
		if caps.Token && info.Token != le.Token() {
			t.Errorf("Inspect(held key).Token = %d, want the lease's token %d", info.Token, le.Token())
		}
		if !caps.Token && info.Token != 0 {
			t.Errorf("Inspect(held key).Token = %d, want 0 (unknown)", info.Token)
		}
		if caps.TTL && (info.TTL <= 0 || info.TTL > le.TTL()) {
			t.Errorf("Inspect(held key).TTL = %v, want in (0, %v]", info.TTL, le.TTL())
		}
		if !caps.TTL && info.TTL != 0 {
			t.Errorf("Inspect(held key).TTL = %v, want 0 (unknown)", info.TTL)
		}
		if want := 0; !caps.Waiters {
			if info.Waiters != -1 {
				t.Errorf("Inspect(held key).Waiters = %d, want -1 (unknown)", info.Waiters)
			}
		} else if info.Waiters != want {
			t.Errorf("Inspect(held key).Waiters = %d, want %d", info.Waiters, want)
		}
		keys, err := driver.Keys(ctx, a, allKeys)
		if err != nil {
			t.Fatalf("Keys: %v", err)
		}
		if !slices.Contains(keys, k) {
			t.Errorf("Keys(allKeys) = %q, want it to list the held key %q", keys, k)
		}
		if keys, err := driver.Keys(ctx, a, 1); err != nil || len(keys) != 1 {
			t.Errorf("Keys(1) = %q, %v, want one key", keys, err)
		}
		if got, err := b.Inspect(ctx, k); err != nil || !got.Held {
			t.Errorf("Inspect through the holder's Locker = %+v, %v, want held", got, err)
		}
		release(t, le)
		info, err = a.Inspect(ctx, k)
		if err != nil {
			t.Fatalf("Inspect(released %q): %v", k, err)
		}
		if info.Held {
			t.Errorf("Inspect(released key) = %+v, want not held", info)
		}
		// Keys lists a key held on any node (Redlock), and a release
		// returns once a majority answered: a straggler node may still
		// hold the key for a moment. It must go within slack.
		for deadline := time.Now().Add(slack); ; time.Sleep(20 * time.Millisecond) {
			keys, err = driver.Keys(ctx, a, allKeys)
			if err != nil {
				t.Fatalf("Keys: %v", err)
			}
			if !slices.Contains(keys, k) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("Keys(allKeys) = %q, lists the key %q released %v ago", keys, k, slack)
				break
			}
		}
	})

	t.Run("Holder", func(t *testing.T) {
		k := key(t)
		ttl := max(10*time.Second, s.lim.MinTTL)
		// Bad descriptions are refused before any I/O: the context is
		// cancelled, so a backend that did I/O first would fail with
		// ErrUnavailable.
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		for _, h := range []string{strings.Repeat("h", backend.MaxHolderLen+1), "a\x1b[2Jb", "\xff", "evil\u202egnp.exe", "zero\u200bwidth"} {
			_, err := b.TryAcquire(cctx, k, &dlock.AcquireOptions{TTL: ttl, Holder: h})
			if !errors.Is(err, dlock.ErrInvalidConfig) {
				t.Errorf("TryAcquire with holder %.20q…: got %v, want an error matching ErrInvalidConfig", h, err)
			}
		}
		for _, h := range []string{"web-3/4242 ünïcode ☃", strings.Repeat("é", backend.MaxHolderLen/2)} {
			le := acquire(t, b, k, &dlock.AcquireOptions{TTL: ttl, Holder: h, AutoRefresh: true})
			info, err := a.Inspect(ctx, k)
			if err != nil {
				t.Fatalf("Inspect(held %q): %v", k, err)
			}
			if !info.Held || info.Holder != h {
				t.Errorf("Inspect(held key) = %+v, want held by %.30q…", info, h)
			}
			if err := le.Refresh(ctx, ttl); err != nil {
				t.Fatalf("Refresh: %v", err)
			}
			if info, err := a.Inspect(ctx, k); err != nil || info.Holder != h {
				t.Errorf("Inspect after Refresh = %+v, %v, want held by %.30q…", info, err, h)
			}
			release(t, le)
			if info, err := a.Inspect(ctx, k); err != nil || info.Held || info.Holder != "" {
				t.Errorf("Inspect(released key) = %+v, %v, want free, no holder", info, err)
			}
		}
		// No description: none is reported.
		le := acquire(t, b, k, &dlock.AcquireOptions{TTL: ttl})
		if info, err := a.Inspect(ctx, k); err != nil || !info.Held || info.Holder != "" {
			t.Errorf("Inspect(key held without a holder) = %+v, %v, want held, no holder", info, err)
		}
		release(t, le)
	})

	if cw, ok := driver.DriverOf(a).(backend.ChangeWatcher); ok {
		t.Run("WatchChanges", func(t *testing.T) { watchChanges(t, cw, b, s.lim) })
	}

	if caps.Waiters {
		t.Run("Waiters", func(t *testing.T) {
			k := key(t)
			le := acquire(t, a, k, &dlock.AcquireOptions{TTL: max(10*time.Second, s.lim.MinTTL)})
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				wl, err := b.Acquire(wctx, k, nil)
				if err == nil {
					err = errors.New("granted while the key was held")
					_ = wl.Release(ctx)
				}
				done <- err
			}()
			pollInspect(t, a, k, func(i dlock.LockInfo) bool { return i.Held && i.Waiters == 1 }, "held with 1 waiter")
			cancel()
			if err := <-done; !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("cancelled waiter: %v, want ErrNotAcquired", err)
			}
			pollInspect(t, a, k, func(i dlock.LockInfo) bool { return i.Held && i.Waiters == 0 }, "held with 0 waiters")
			release(t, le)
		})
	}
}

// watchChanges checks a backend.ChangeWatcher: a grant and a release by
// another Locker are each reported within slack, and stop ends the watch.
func watchChanges(t *testing.T, cw backend.ChangeWatcher, other *dlock.Locker, lim dlock.Limits) {
	ctx := t.Context()
	k := key(t)
	ch, stop, err := cw.WatchChanges(ctx, k)
	if err != nil {
		t.Fatalf("WatchChanges: %v", err)
	}
	defer stop()
	select {
	case _, ok := <-ch:
		// A spurious receive is allowed, once; a closed channel is not
		// (the watch ended by itself with nothing wrong).
		if !ok {
			t.Fatal("WatchChanges: the channel was closed before any change")
		}
	default:
	}
	expect := func(what string) {
		t.Helper()
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatalf("WatchChanges: the channel was closed, want a receive on %s", what)
			}
		case <-time.After(slack):
			t.Fatalf("WatchChanges: nothing received within %v of %s", slack, what)
		}
	}
	le := acquire(t, other, k, &dlock.AcquireOptions{TTL: max(10*time.Second, lim.MinTTL), Holder: "watched"})
	expect("a grant")
	// A grant may signal more than once (ZooKeeper: the key's directory
	// made, then the lock node): let those pass, so that only the
	// release can satisfy the next receive.
	for quiet := time.After(300 * time.Millisecond); ; {
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatal("WatchChanges: the channel was closed after a grant")
			}
			continue
		case <-quiet:
		}
		break
	}
	release(t, le)
	expect("a release")
}

// pollInspect inspects key until ok says yes, within slack.
func pollInspect(t *testing.T, l *dlock.Locker, key string, ok func(dlock.LockInfo) bool, want string) {
	t.Helper()
	deadline := time.Now().Add(slack)
	for {
		info, err := l.Inspect(t.Context(), key)
		if err != nil {
			t.Fatalf("Inspect(%q): %v", key, err)
		}
		if ok(info) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Inspect(%q) = %+v after %v, want %s", key, info, slack, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// allKeys is the limit of the Keys calls that look for one key among all:
// more than a test server holds, even with other tests' keys on it.
const allKeys = 1 << 20
