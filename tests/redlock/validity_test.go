package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// TestDriverRefusesGrantPastValidity: the Driver itself, without the
// Locker's own check of late grants, refuses a grant whose validity
// (TTL − elapsed − drift) is gone when it is judged. TryAcquire pauses
// once a majority has granted (afterGrant, as a GC or a stopped
// process would), until the grant has lapsed on the nodes: another
// Driver then takes the key. The paused attempt must return no lease
// (ErrUnavailable), and its clean-up must leave the other holder's key
// alone.
func TestDriverRefusesGrantPastValidity(t *testing.T) {
	t.Parallel()
	a := addrs(servers.Redis(t, 5))
	// A per-node timeout well above a loaded machine's round trip (it is
	// capped at a tenth of the TTL: 100ms).
	opts := &redlock.Options{NodeTimeout: time.Second}
	d, err := redlock.NewDriver(t.Context(), clients(t, a), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	other, err := redlock.NewDriver(t.Context(), clients(t, a), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	const ttl = time.Second
	key := uniqueKey(t)
	var (
		paused bool          // a majority granted, and TryAcquire paused
		taken  backend.Lease // the other Driver's lease, taken during the pause
	)
	afterGrant(d, func() {
		paused = true
		// Wait (polling, generously bounded) until the grant has lapsed
		// on a majority: the other Driver gets the key.
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if le, err := other.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 30 * time.Second}); err == nil {
				taken = le
				return
			}
		}
	})
	var le backend.Lease
	// On a loaded machine a round may fail without a majority (nothing
	// to test then; the failed attempt cleans up after itself): try again.
	for i := 0; i < 20 && !paused; i++ {
		le, err = d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: ttl})
	}
	if !paused {
		t.Fatalf("no majority granted in 20 attempts (last: %v)", err)
	}
	if taken == nil {
		t.Fatalf("the other Driver did not get the key within 30s of the pause: the %v grant never lapsed", ttl)
	}
	if err == nil {
		_ = le.Release(t.Context())
		t.Fatalf("TryAcquire returned a lease (token %d) whose grant was judged after its %v TTL had passed, while another Driver holds the key (token %d)",
			le.Token(), ttl, taken.Token())
	}
	if !errors.Is(err, backend.ErrUnavailable) || errors.Is(err, backend.ErrNotAcquired) {
		t.Errorf("TryAcquire judged after its validity = %v; want ErrUnavailable (and not ErrNotAcquired)", err)
	}
	t.Logf("TryAcquire after the pause: %v", err)
	d.Close() // waits for the failed attempt's clean-up
	if err := taken.Release(t.Context()); err != nil {
		t.Errorf("the other Driver's Release after the paused attempt's clean-up = %v; want nil (its key left alone)", err)
	}
}
