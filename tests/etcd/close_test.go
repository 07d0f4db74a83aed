package etcd_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// TestCloseDuringBackgroundRevoke: a Release whose delete and revoke fail
// leaves the revoke to a background loop. Close while that loop waits for
// its next attempt, with the cluster answering again: Close must make one
// last attempt (and return promptly), so the released lock is free when
// Close returns, not blocked for the rest of its TTL. (Before the fix:
// "Close took 0s; 2 revoke attempts before it returned, 0 after; then the
// key exists: true".)
func TestCloseDuringBackgroundRevoke(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	const ttl = 30 * time.Second
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := etcd.OwnerOf(le)
	var answers atomic.Bool
	var attempts atomic.Int32
	failed := make(chan struct{}, 16)
	injectFault(d, func(doing string, id clientv3.LeaseID) error {
		switch {
		case doing == "deleting the lock key" && !answers.Load():
			return errors.New("test: the delete is not answered")
		case doing == "revoking a lease" && id == own.Lease:
			attempts.Add(1)
			if answers.Load() {
				return nil
			}
			select {
			case failed <- struct{}{}:
			default:
			}
			return errors.New("test: the revoke is not answered")
		}
		return nil
	})
	if err := le.Release(t.Context()); err == nil {
		t.Fatal("Release with the delete failing succeeded")
	}
	// Release's own revoke failed; wait for the loop's first retry to
	// fail, then Close while the loop waits for the next one.
	for range 2 {
		select {
		case <-failed:
		case <-time.After(slack):
			t.Fatal("no background revoke was tried")
		}
	}
	answers.Store(true) // the cluster answers again
	n := attempts.Load()
	start := time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	last := attempts.Load() - n
	_, exists := keyLease(t, admin, own)
	t.Logf("Close took %v; %d revoke attempts during it; then the key exists: %v", took.Round(time.Millisecond), last, exists)
	if took > slack {
		t.Errorf("Close took %v with a background revoke running", took)
	}
	if exists {
		t.Errorf("after Close the released lock's key is still there (%d revoke attempts during Close although the cluster answers)", last)
	}
}
