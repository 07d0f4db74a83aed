package zookeeper_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// TestCancelledWaitsRaceFree: waiting Acquires cut by deadlines of a few
// milliseconds, many of them while their watch is being set. Run under
// -race (as CI runs it): the watch's call, still running when its
// context ended, once wrote a result the waiter returned (a data race on
// the mutex path too; this test saw it red before the fix).
func TestCancelledWaitsRaceFree(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	a, b := newLocker(t, srv, nil), newLocker(t, srv, nil)
	key := "cancelled-waits/" + t.Name()
	le, err := a.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(t.Context())
	for range 1500 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(500+rand.IntN(3900))*time.Microsecond)
		_, err := b.Acquire(ctx, key, nil)
		cancel()
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("a waiting Acquire of a held key, cut by its deadline: %v; want ErrNotAcquired", err)
		}
	}
}
