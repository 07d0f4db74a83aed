package redis_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
)

// TestSharedReservationOutlivesExpiredReaders: a waiting writer's
// reservation holds for its Request.Wait even once the readers it waited
// for have expired rather than released (the backend package's Shared
// leases; memory.Store refuses the reader too). The writer's time was kept
// in the lock key's value, which expired with the last reader, so a new
// reader was granted once the reader (TTL 1s) had expired, 1.5s after a
// writer asked to wait 10s. While the
// readers are valid, a writer's RetryAfter stays the time until the last
// of them expires (not the writer's time, which would make it wait longer
// than needed); once they have expired, a reader is refused until the
// writer's time, any writer takes the key (marked for the refused reader,
// whose watch hears its release), and a reader is granted after the
// writer's release.
func TestSharedReservationOutlivesExpiredReaders(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	lk := lockKey(key)

	r, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Second, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	var held *backend.HeldError
	if _, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: 10 * time.Second, Wait: 10 * time.Second}); !errors.As(err, &held) {
		t.Fatalf("a waiting writer's attempt: %v, want a HeldError", err)
	}
	if held.RetryAfter > time.Second {
		t.Errorf("the writer's RetryAfter %v, want the reader's 1s at most (when the key can be the writer's)", held.RetryAfter)
	}
	if v := sharedValue(t, c, key); !writerWaits(v) {
		t.Fatalf("lock value %q after the writer's attempt: no writer's time", v)
	}
	time.Sleep(1500 * time.Millisecond) // the reader expires; nobody releases it

	read := backend.Request{Key: key, TTL: 10 * time.Second, Shared: true}
	if l, err := d.TryAcquire(ctx, read); !errors.As(err, &held) {
		if err == nil {
			_ = l.Release(ctx)
		}
		t.Fatalf("a reader after the readers expired, the writer's 10s reservation running: %v, want a HeldError", err)
	}
	if held.RetryAfter < 7*time.Second || held.RetryAfter > 10*time.Second {
		t.Errorf("the refused reader's RetryAfter %v, want what is left of the writer's 10s", held.RetryAfter)
	}
	if pttl := c.PTTL(ctx, lk).Val(); pttl < 7*time.Second || pttl > 10*time.Second {
		t.Errorf("lock key PTTL %v, want what is left of the writer's 10s", pttl)
	}
	info, err := d.Inspect(ctx, key)
	if err != nil || info.Held || len(info.Holders) != 0 {
		t.Errorf("Inspect of a reservation whose readers expired: %+v, %v; want free", info, err)
	}
	if err := r.Release(ctx); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release of the expired reader: %v, want ErrNotHeld", err)
	}
	wake, stop, err := d.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// Any writer takes the reservation, a TryAcquire as well.
	w, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("a writer's TryAcquire on the reservation left by expired readers: %v", err)
	}
	if v := sharedValue(t, c, key); !strings.HasSuffix(v, "+") || strings.HasPrefix(v, "\x00") {
		t.Errorf("the writer's lock value %q: want a grant's value, marked (the refused reader waits)", v)
	}
	if n := c.Exists(ctx, lk+":holders", lk+":tokens").Val(); n != 0 {
		t.Errorf("%d holders or tokens keys left under the writer's lock", n)
	}
	if _, err := d.TryAcquire(ctx, read); !errors.As(err, &held) {
		t.Fatalf("a reader while the writer holds: %v, want a HeldError", err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(20 * time.Second):
		t.Fatal("the reader's watch did not hear the writer's release")
	}
	nr, err := d.TryAcquire(ctx, read)
	if err != nil {
		t.Fatalf("a reader after the writer: %v", err)
	}
	if err := nr.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, sharedKeys(key)...).Val(); n != 0 {
		t.Errorf("%d keys left after the last release", n)
	}
}

// TestSharedReservationEndsAtWritersTime: the reservation of a writer that
// never comes back ends at its time (its attempt plus Request.Wait), readers
// expired or not: a reader is refused until then and granted after it.
func TestSharedReservationEndsAtWritersTime(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	ctx := t.Context()
	key := uniqueKey(t)

	if _, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: 500 * time.Millisecond, Shared: true}); err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	var held *backend.HeldError
	if _, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: 10 * time.Second, Wait: 2 * time.Second}); !errors.As(err, &held) {
		t.Fatalf("a waiting writer's attempt: %v, want a HeldError", err)
	}
	time.Sleep(time.Second) // the reader expires; nobody releases it
	read := backend.Request{Key: key, TTL: 10 * time.Second, Shared: true}
	if l, err := d.TryAcquire(ctx, read); !errors.As(err, &held) {
		if err == nil {
			_ = l.Release(ctx)
		}
		t.Fatalf("a reader 1s after the writer asked to wait 2s (the readers expired): %v, want a HeldError", err)
	}
	var granted time.Time
	eventually(t, "a reader after the writer's time", func() bool {
		l, err := d.TryAcquire(ctx, read)
		if err != nil {
			return false
		}
		granted = time.Now()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return true
	})
	if since := granted.Sub(asked); since < 1900*time.Millisecond {
		t.Errorf("a reader was granted %v after the writer asked to wait 2s", since)
	}
	if n := c.Exists(ctx, sharedKeys(key)...).Val(); n != 0 {
		t.Errorf("%d keys left after the last release", n)
	}
}

// TestRefusalRetryAfterNeverZero: a request refused by a key in its last
// millisecond (PTTL 0: it expires with the server clock's next tick) is
// told to try again 1ms later, not 0 (which the dlock layer reads as
// "unknown" and turns into its fallback poll, RetryMax). A waiter that
// marked such a key is not woken by the release of whoever takes the key
// next (a fresh key, unmarked: its release publishes nothing); with
// RetryAfter 1ms it tries again right after the key is gone and marks
// what holds it then. The key is made to expire 1 or 2ms after it is set,
// again and again, so that some refusals meet PTTL 0: an exclusive holder
// refusing a writer and a reader, and a reservation refusing a reader.
func TestRefusalRetryAfterNeverZero(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	d := newDriver(t, serverClient(t), nil)
	ctx := t.Context()
	for _, tc := range []struct {
		name  string
		value string // planted
		req   backend.Request
	}{
		{"writer behind a writer", "planted" + strings.Repeat("ab", 16), backend.Request{}},
		{"reader behind a writer", "planted" + strings.Repeat("ab", 16), backend.Request{Shared: true}},
		{"reader behind a reservation", "\x00w99999999999999+", backend.Request{Shared: true}},
	} {
		key := uniqueKey(t)
		req := tc.req
		req.Key, req.TTL = key, time.Second
		refused, zero := 0, 0
		for i := range 1000 {
			if err := admin.Set(ctx, lockKey(key), tc.value, time.Duration(1+i%2)*time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
			l, err := d.TryAcquire(ctx, req)
			var held *backend.HeldError
			switch {
			case err == nil:
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			case errors.As(err, &held):
				refused++
				if held.RetryAfter <= 0 {
					zero++
				}
			default:
				t.Fatal(err)
			}
		}
		t.Logf("%s: %d refusals, %d with RetryAfter 0", tc.name, refused, zero)
		if zero > 0 {
			t.Errorf("%s: %d of %d refusals said RetryAfter 0 (a key in its last millisecond), want 1ms at least", tc.name, zero, refused)
		}
		if refused == 0 {
			t.Errorf("%s: no refusal: the test tested nothing", tc.name)
		}
	}
}
