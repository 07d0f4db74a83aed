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

// metric reads a counter or gauge (its first sample) from the member at
// addr.
func metric(ctx context.Context, addr, name string) (float64, error) {
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
		if n, v, ok := strings.Cut(sc.Text(), " "); ok && n == name {
			return strconv.ParseFloat(v, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no metric %s at %s", name, addr)
}

// TestWaiterWatchStartsNow: a waiter's predecessor watch starts at the
// server's current revision, never at one the server has passed (such a
// watch is served by etcd's unsynced-watcher loop, every 100ms), and what
// happened between the queue read and the watch's creation is not missed.
//
//   - deleted-before-watch: the predecessor is deleted between the
//     waiter's queue read and its watch. The waiter must be granted
//     without any watch event sent to it (the server's
//     etcd_debugging_mvcc_events_total does not move): a watch from the
//     read's revision + 1 would get that delete, late, from the unsynced
//     loop.
//   - write-before-watch: an unrelated write lands between the read and the
//     watch, the predecessor goes later: the waiter is woken by its watch.
func TestWaiterWatchStartsNow(t *testing.T) {
	t.Parallel()
	c, err := servers.StartEtcd(t.Context(), 1)
	if err != nil {
		t.Fatalf("starting etcd: %v", err)
	}
	t.Cleanup(func() { _ = c.Terminate(context.WithoutCancel(t.Context())) })
	addr := c.Members[0].Addr()
	admin := newClient(t, c.Endpoints())

	// waiterLocker returns a Locker whose driver calls hook between its
	// queue read and its watch.
	waiterLocker := func(t *testing.T, hook func()) *dlock.Locker {
		cli := newClient(t, c.Endpoints())
		d, err := etcd.NewDriver(t.Context(), cli, nil)
		if err != nil {
			t.Fatal(err)
		}
		etcd.AfterQueueRead(d, hook)
		l := dlock.New(d, nil)
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	// predecessor puts a key ahead of the waiter in key's queue.
	predecessor := func(t *testing.T, key string) string {
		g, err := admin.Grant(t.Context(), 60)
		if err != nil {
			t.Fatal(err)
		}
		k := dir(key) + "0"
		if _, err := admin.Put(t.Context(), k, "", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		return k
	}
	type result struct {
		le  *dlock.Lease
		err error
	}
	acquire := func(t *testing.T, l *dlock.Locker, key string) <-chan result {
		got := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), slack)
			defer cancel()
			le, err := l.Acquire(ctx, key, &dlock.AcquireOptions{TTL: time.Minute})
			got <- result{le, err}
		}()
		return got
	}

	t.Run("deleted-before-watch", func(t *testing.T) {
		key := uniqueKey(t)
		pred := predecessor(t, key)
		var once bool
		l := waiterLocker(t, func() {
			if !once {
				once = true
				if _, err := admin.Delete(t.Context(), pred); err != nil {
					t.Error(err)
				}
			}
		})
		before, err := metric(t.Context(), addr, "etcd_debugging_mvcc_events_total")
		if err != nil {
			t.Fatal(err)
		}
		r := <-acquire(t, l, key)
		if r.err != nil {
			t.Fatalf("the waiter's Acquire: %v", r.err)
		}
		le := r.le
		after, err := metric(t.Context(), addr, "etcd_debugging_mvcc_events_total")
		if err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Errorf("%v watch event(s) sent while the waiter was granted; want none: the waiter waited for a watch "+
				"that started before the predecessor's delete (served by etcd's 100ms unsynced loop)", after-before)
		}
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("write-before-watch", func(t *testing.T) {
		key := uniqueKey(t)
		pred := predecessor(t, key)
		var once bool
		l := waiterLocker(t, func() {
			if !once {
				once = true
				if _, err := admin.Put(t.Context(), key+".unrelated", ""); err != nil {
					t.Error(err)
				}
			}
		})
		awaitWatchers(t, addr, 0, "before the waiter queues")
		got := acquire(t, l, key)
		awaitWatchers(t, addr, 1, "the waiter's watch")
		select {
		case r := <-got:
			t.Fatalf("the waiter's Acquire returned while the predecessor is there: %v, %v", r.le, r.err)
		default:
		}
		if _, err := admin.Delete(t.Context(), pred); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatalf("the waiter's Acquire: %v", r.err)
			}
			if err := r.le.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		case <-time.After(slack):
			t.Fatal("the waiter was not woken by the predecessor's delete")
		}
	})
}
