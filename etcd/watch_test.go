package etcd_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/servers"
	"github.com/dlock-go/dlock/etcd"
)

// watchers reads the number of watchers the member at addr keeps, from its
// metrics endpoint (served on the client port).
func watchers(ctx context.Context, addr string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if ok && (name == "etcd_debugging_mvcc_watcher_total" || name == "etcd_mvcc_watcher_total") {
			n, err := strconv.ParseFloat(v, 64)
			return int(n), err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no watcher_total metric at %s", addr)
}

// awaitWatchers polls the member's watcher count until it is want, and
// fails the test if it is not within slack.
func awaitWatchers(t *testing.T, addr string, want int, what string) {
	t.Helper()
	var n int
	var err error
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n, err = watchers(t.Context(), addr); err == nil && n == want {
			return
		}
	}
	t.Fatalf("%s: the server has %d watcher(s) (err %v), want %d", what, n, err, want)
}

// TestLossWatchEndsAfterLoss: once a lease's loss watch has reported the
// loss, its server-side watcher is gone, though the lease is neither
// released nor its Locker closed.
func TestLossWatchEndsAfterLoss(t *testing.T) {
	t.Parallel()
	// A member of the test's own: the watcher count is the server's total.
	c, err := servers.StartEtcd(t.Context(), 1)
	if err != nil {
		t.Fatalf("starting etcd: %v", err)
	}
	t.Cleanup(func() { _ = c.Terminate(context.WithoutCancel(t.Context())) })
	addr := c.Members[0].Addr()
	admin := newClient(t, c.Endpoints())
	l := newLocker(t, c.Endpoints(), nil)

	base, err := watchers(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	le, err := l.Acquire(t.Context(), uniqueKey(t), &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	awaitWatchers(t, addr, base+1, "while the lease is held") // its loss watch
	own, _ := etcd.OwnerOf(le)
	if _, err := admin.Revoke(t.Context(), own.Lease); err != nil {
		t.Fatal(err)
	}
	select {
	case <-le.Done():
	case <-time.After(slack):
		t.Fatal("Done did not fire after the lease was revoked")
	}
	if err := le.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", err)
	}
	awaitWatchers(t, addr, base, "after the loss was reported (lease not released, Locker open)")
}

// TestWaiterPartitioned: a waiter whose member is cut off from the others
// (they are paused, so its member has no leader) cannot keep its lease
// alive; its lease may have expired once the TTL has passed since the last
// keepalive the cluster answered, and the queued Acquire must then fail —
// not stay queued on a member that cannot tell it anything.
func TestWaiterPartitioned(t *testing.T) {
	t.Parallel()
	c := faultCluster(t)
	eps := c.Endpoints()
	admin := newClient(t, eps)
	holder := newLocker(t, eps, nil)
	key := uniqueKey(t)

	la, err := holder.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The waiter talks to one follower only; the leader and the other
	// follower are paused.
	lead := leader(t, c, admin)
	x := (lead + 1) % len(c.Members)
	waiter := newLocker(t, []string{c.Members[x].Addr()}, nil)
	const ttl = 3 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res := make(chan error, 1)
	go func() {
		lb, err := waiter.Acquire(ctx, key, &dlock.AcquireOptions{TTL: ttl})
		if err == nil {
			t.Errorf("the partitioned waiter was granted the lock (token %d)", lb.Token())
			_ = lb.Release(context.WithoutCancel(ctx))
		}
		res <- err
	}()
	for end := time.Now().Add(slack); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the waiter never queued")
		}
		resp, err := admin.Get(t.Context(), dir(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 2 {
			break
		}
	}
	var paused []int
	defer func() {
		for _, i := range paused {
			if err := c.Members[i].Unpause(context.WithoutCancel(t.Context())); err != nil {
				t.Errorf("unpausing member %d: %v", i, err)
			}
		}
	}()
	for i := range c.Members {
		if i != x {
			if err := c.Members[i].Pause(t.Context()); err != nil {
				t.Fatal(err)
			}
			paused = append(paused, i)
		}
	}
	start := time.Now()
	bound := ttl + 6*time.Second
	select {
	case err := <-res:
		t.Logf("the partitioned waiter failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
		if !errors.Is(err, dlock.ErrUnavailable) && !errors.Is(err, dlock.ErrLeaseLost) {
			t.Errorf("Acquire of the partitioned waiter = %v, want ErrUnavailable or ErrLeaseLost", err)
		}
	case <-time.After(bound):
		cancel()
		<-res
		t.Fatalf("the partitioned waiter was still queued %v after the partition (TTL %v)", bound, ttl)
	}
	if err := la.Err(); err != nil {
		t.Logf("holder: %v", err)
	}
}
