package etcd_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// watchers reads the number of watchers the member at addr keeps, from its
// metrics endpoint (served on the client port).
func watchers(ctx context.Context, addr string) (int, error) {
	n, err := metric(ctx, addr, "etcd_debugging_mvcc_watcher_total", "etcd_mvcc_watcher_total")
	return int(n), err
}

// metric reads a counter or gauge (its first sample, under the first of
// names found) from the member at addr.
func metric(ctx context.Context, addr string, names ...string) (float64, error) {
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
		if n, v, ok := strings.Cut(sc.Text(), " "); ok && slices.Contains(names, n) {
			return strconv.ParseFloat(v, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no metric %s at %s", strings.Join(names, " or "), addr)
}

// acquired is the outcome of an Acquire run by acquireAsync.
type acquired struct {
	le  *dlock.Lease
	err error
}

// acquireAsync runs l.Acquire of key (TTL ttl) under ctx in a goroutine and
// sends its outcome on the returned channel.
func acquireAsync(ctx context.Context, l *dlock.Locker, key string, ttl time.Duration) <-chan acquired {
	res := make(chan acquired, 1)
	go func() {
		le, err := l.Acquire(ctx, key, &dlock.AcquireOptions{TTL: ttl})
		res <- acquired{le, err}
	}()
	return res
}

// putPredecessor puts a key ahead of any waiter in key's queue, on a lease
// of ttl seconds, and returns it.
func putPredecessor(t *testing.T, admin *clientv3.Client, key string, ttl int64) string {
	t.Helper()
	g, err := admin.Grant(t.Context(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	k := dir(key) + "0"
	if _, err := admin.Put(t.Context(), k, "", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	return k
}

// pauseOthers pauses every member of c but x, appending the index of each
// one paused to *paused, and stops at the first error.
func pauseOthers(ctx context.Context, c *servers.EtcdCluster, x int, paused *[]int) error {
	for i := range c.Members {
		if i != x {
			if err := c.Members[i].Pause(ctx); err != nil {
				return err
			}
			*paused = append(*paused, i)
		}
	}
	return nil
}

// unpauseAll unpauses the members of c at paused, reporting (not failing
// at once on) each error: for deferred use.
func unpauseAll(t *testing.T, c *servers.EtcdCluster, paused []int) {
	t.Helper()
	for _, i := range paused {
		if err := c.Members[i].Unpause(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("unpausing member %d: %v", i, err)
		}
	}
}

// deletePredecessor deletes pred through cli, retrying (each try bounded
// by 2s) until it succeeds or slack has passed; then it fails the test
// with what.
func deletePredecessor(t *testing.T, cli *clientv3.Client, pred, what string) {
	t.Helper()
	for end := time.Now().Add(slack); ; time.Sleep(100 * time.Millisecond) {
		dctx, dcancel := context.WithTimeout(t.Context(), 2*time.Second)
		_, err := cli.Delete(dctx, pred)
		dcancel()
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: %v", what, err)
		}
	}
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

// TestWatchPerDirectory: a Locker watches the directories of the locks it
// uses, one watch each, up to maxDirWatches, and the whole prefix for the
// directories beyond: holding many leases adds no watcher past that, and
// a lease's loss is still reported (Done, with ErrLeaseLost) when its lease
// is revoked, through either kind of watch, and no other lease ends. A
// watch no longer in use lingers for the next acquire of its lock, and
// gives its place to another directory. (Before, each Locker watched its
// whole prefix, and received every release under it: see
// TestWatchNarrowed.)
func TestWatchPerDirectory(t *testing.T) {
	t.Parallel()
	// A member of the test's own: the watcher count is the server's total.
	c := ownCluster(t, 1)
	addr := c.Members[0].Addr()
	admin := newClient(t, c.Endpoints())
	base, err := watchers(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	d, l := ownDriver(t, c.Endpoints())
	awaitWatchers(t, addr, base, "with a Locker open and no lock used")
	most := maxDirWatches()
	n := most + 6
	keys := make([]string, n)
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		keys[i] = uniqueKey(t) + strconv.Itoa(i)
		if leases[i], err = l.Acquire(t.Context(), keys[i], &dlock.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	awaitWatchers(t, addr, base+most+1, fmt.Sprintf("with %d leases held (a watch per directory up to %d, then the prefix)", n, most))
	if got := dirWatches(d); got != most+1 {
		t.Errorf("%d watches in use, want %d", got, most+1)
	}
	// One lease on a directory watch, one on the prefix watch.
	for _, i := range []int{0, n - 1} {
		own, _ := etcd.OwnerOf(leases[i])
		if _, err := admin.Revoke(t.Context(), own.Lease); err != nil {
			t.Fatal(err)
		}
		select {
		case <-leases[i].Done():
		case <-time.After(slack):
			t.Fatalf("lease %d: Done did not fire after the lease was revoked", i)
		}
		if err := leases[i].Err(); !errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("lease %d: Err = %v, want ErrLeaseLost", i, err)
		}
	}
	for _, le := range leases[1 : n-1] {
		if err := le.Err(); err != nil {
			t.Fatalf("another lease ended with the revoked ones: %v", err)
		}
	}
	for _, le := range leases {
		_ = le.Release(t.Context())
	}
	if got := dirWatches(d); got != 0 {
		t.Errorf("%d watches in use after every lease was released, want 0", got)
	}
	// They linger: taking one of the locks again makes no watch, and a
	// new lock gets a watch of its own in the place of one that lingers
	// (not the prefix watch).
	for _, c := range []struct {
		key  string
		made int
	}{{keys[1], 0}, {uniqueKey(t) + "-new", 1}} {
		made := watchesMade(d)
		le, err := l.Acquire(t.Context(), c.key, &dlock.AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if got := watchesMade(d) - made; got != c.made {
			t.Errorf("acquiring %q made %d watches, want %d", c.key, got, c.made)
		}
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	awaitWatchers(t, addr, base+most+1, "after the watches lingered and one gave its place")
}

// TestWatchLingerEnds: a directory watch no longer in use is kept while its
// lock is taken again within the linger (each release re-arms it), and
// ends once it has lingered that long unused; the next acquire of the lock
// then makes a new one. Not parallel: the linger (2s here, 30s by
// default) is the package's, read by NewDriver.
func TestWatchLingerEnds(t *testing.T) {
	c := ownCluster(t, 1)
	addr := c.Members[0].Addr()
	base, err := watchers(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	const linger = 2 * time.Second
	old := setWatchLinger(linger)
	t.Cleanup(func() { setWatchLinger(old) })
	d, l := ownDriver(t, c.Endpoints())
	setWatchLinger(old)
	key := uniqueKey(t)
	cycle := func() (made int) {
		t.Helper()
		before := watchesMade(d)
		le, err := l.Acquire(t.Context(), key, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		return watchesMade(d) - before
	}
	if n := cycle(); n != 1 {
		t.Fatalf("the first acquire made %d watches, want 1", n)
	}
	awaitWatchers(t, addr, base+1, "after the first release")
	// Taken again every quarter of the linger, for 3 lingers: kept. (The
	// margin, 1.5s, is for an acquire slowed by a busy machine: an
	// acquire's watch counts from when it takes the directory's hub.)
	const every = linger / 4
	for end := time.Now().Add(3 * linger); time.Now().Before(end); {
		time.Sleep(every)
		if n := cycle(); n != 0 {
			t.Fatalf("an acquire %v after the last release made %d watches, want 0 (the watch ended early)", every, n)
		}
	}
	// Left alone: it ends, and the next acquire makes a new one.
	awaitWatchers(t, addr, base, "after the watch lingered unused")
	if n := cycle(); n != 1 {
		t.Fatalf("an acquire after the watch ended made %d watches, want 1", n)
	}
}

// TestWatchNarrowed: a Locker's watches receive the releases of the locks
// it uses, not those of other Lockers' locks under the same prefix.
// (Before, every Locker watched its whole prefix, so n Lockers under one
// prefix each received every release: n watch events per release.)
func TestWatchNarrowed(t *testing.T) {
	t.Parallel()
	eps := ownCluster(t, 1).Endpoints()
	da, la := ownDriver(t, eps)
	_, lb := ownDriver(t, eps)
	mine, err := la.Acquire(t.Context(), uniqueKey(t)+"-a", &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mine.Release(context.WithoutCancel(t.Context())) }()
	before := watchEvents(da)
	const cycles = 20
	key := uniqueKey(t) + "-b"
	for range cycles {
		le, err := lb.Acquire(t.Context(), key, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	// A release seen by A's watch would arrive within a round trip; give
	// the last ones time to.
	time.Sleep(500 * time.Millisecond)
	if got := watchEvents(da) - before; got != 0 {
		t.Errorf("A's watches received %d events while another Locker took and released its own lock %d times; want 0", got, cycles)
	}
	// A still sees its own: the release of its lock is one event.
	if err := mine.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(slack); watchEvents(da) == before; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("A's watch did not receive the release of its own lock")
		}
	}
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
	// The server's floor (1.5 × its 1s election timeout, rounded up).
	const ttl = 2 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res := acquireAsync(ctx, waiter, key, ttl)
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
	defer func() { unpauseAll(t, c, paused) }()
	if err := pauseOthers(t.Context(), c, x, &paused); err != nil {
		t.Fatal(err)
	}
	// The waiter fails once its TTL has passed since its last answered
	// keepalive (sent at most TTL/3 before the partition), and then spends
	// up to 2s trying to revoke its lease.
	start := time.Now()
	bound := ttl + 5*time.Second
	select {
	case r := <-res:
		t.Logf("the partitioned waiter returned after %v: %v", time.Since(start).Round(time.Millisecond), r.err)
		if r.err == nil {
			_ = r.le.Release(context.WithoutCancel(ctx))
			t.Fatalf("the partitioned waiter was granted the lock (token %d)", r.le.Token())
		}
		if !errors.Is(r.err, dlock.ErrUnavailable) && !errors.Is(r.err, dlock.ErrLeaseLost) {
			t.Errorf("Acquire of the partitioned waiter = %v, want ErrUnavailable or ErrLeaseLost", r.err)
		}
	case <-time.After(bound):
		cancel()
		if r := <-res; r.err == nil {
			_ = r.le.Release(context.WithoutCancel(ctx))
		}
		t.Fatalf("the partitioned waiter was still queued %v after the partition (TTL %v)", bound, ttl)
	}
	if err := la.Err(); err != nil {
		t.Logf("holder: %v", err)
	}
}

// TestWaiterWakesFromPrefixWatch: a waiter learns of its predecessor's
// delete from its driver's watch of the directory, registered before it reads its
// queue, so that nothing between the read and the wait is missed. The
// waiter's TTL is a minute, so its re-read after a keepalive (every 20s)
// cannot be what wakes it within slack (10s).
//
//   - deleted-after-read: the predecessor is deleted between the waiter's
//     queue read and its wait. The waiter must be granted.
//   - write-after-read: an unrelated write lands between the read and the
//     wait, the predecessor goes later: the waiter is woken, and it added
//     no watcher on the server (the driver's watch of the directory,
//     made when the waiter joined, serves it).
func TestWaiterWakesFromPrefixWatch(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, 1)
	addr := c.Members[0].Addr()
	admin := newClient(t, c.Endpoints())

	// waiterLocker returns a Locker whose driver calls hook between its
	// first queue read and its wait (once only).
	waiterLocker := func(t *testing.T, hook func()) *dlock.Locker {
		cli := newClient(t, c.Endpoints())
		d, err := etcd.NewDriver(t.Context(), cli, nil)
		if err != nil {
			t.Fatal(err)
		}
		var once bool
		afterQueueRead(d, func() {
			if !once {
				once = true
				hook()
			}
		})
		l := mustNew(t, d, nil)
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	acquire := func(t *testing.T, l *dlock.Locker, key string) <-chan acquired {
		ctx, cancel := context.WithTimeout(t.Context(), 2*slack)
		t.Cleanup(cancel)
		return acquireAsync(ctx, l, key, time.Minute)
	}
	granted := func(t *testing.T, got <-chan acquired, what string) {
		t.Helper()
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatalf("the waiter's Acquire: %v", r.err)
			}
			if err := r.le.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		case <-time.After(slack):
			t.Fatalf("the waiter was not woken by the predecessor's delete %s", what)
		}
	}

	t.Run("deleted-after-read", func(t *testing.T) {
		key := uniqueKey(t)
		pred := putPredecessor(t, admin, key, 60)
		l := waiterLocker(t, func() {
			if _, err := admin.Delete(t.Context(), pred); err != nil {
				t.Error(err)
			}
		})
		granted(t, acquire(t, l, key), "between its queue read and its wait")
	})

	t.Run("write-after-read", func(t *testing.T) {
		key := uniqueKey(t)
		pred := putPredecessor(t, admin, key, 60)
		base, err := watchers(t.Context(), addr)
		if err != nil {
			t.Fatal(err)
		}
		read := make(chan struct{})
		l := waiterLocker(t, func() {
			if _, err := admin.Put(t.Context(), key+".unrelated", ""); err != nil {
				t.Error(err)
			}
			close(read)
		})
		got := acquire(t, l, key)
		select {
		case <-read:
		case <-time.After(slack):
			t.Fatal("the waiter did not read its queue")
		}
		awaitWatchers(t, addr, base+1, "with the waiter queued") // its directory's watch
		select {
		case r := <-got:
			t.Fatalf("the waiter's Acquire returned while the predecessor is there: %v, %v", r.le, r.err)
		default:
		}
		if n, err := watchers(t.Context(), addr); err != nil || n != base+1 {
			t.Errorf("the server has %d watcher(s) (err %v) with the waiter queued, want %d: a waiter adds none to its directory's", n, err, base+1)
		}
		if _, err := admin.Delete(t.Context(), pred); err != nil {
			t.Fatal(err)
		}
		granted(t, got, "after a write")
	})
}

// TestWaiterWatchOnFrozenMember: the member that holds a waiter's
// predecessor watch freezes (its process is paused: its connections stay
// open, it answers nothing, it cancels nothing), and the predecessor is
// deleted through the other members. The waiter must still be granted,
// within about a keepalive period (a third of its TTL) of the delete: it
// reads its predecessor again after each answered keepalive. The waiter's
// client is one a caller would pass in (no gRPC keepalive pings), so only
// that re-read can wake it.
func TestWaiterWatchOnFrozenMember(t *testing.T) {
	t.Parallel()
	c := faultCluster(t)
	eps := c.Endpoints()
	admin := newClient(t, eps)
	key := uniqueKey(t)
	pred := putPredecessor(t, admin, key, 120)
	base := make([]int, len(c.Members))
	for i, m := range c.Members {
		var err error
		if base[i], err = watchers(t.Context(), m.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	w := newLocker(t, eps, nil)
	const ttl = 6 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res := acquireAsync(ctx, w, key, ttl)
	on := -1
	for end := time.Now().Add(slack); on < 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the waiter's watch was not found on any member")
		}
		for i, m := range c.Members {
			if n, err := watchers(t.Context(), m.Addr()); err == nil && n > base[i] {
				on = i
			}
		}
	}
	if err := c.Members[on].Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Members[on].Unpause(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("unpausing member %d: %v", on, err)
		}
	}()
	var others []string
	for i, m := range c.Members {
		if i != on {
			others = append(others, m.Addr())
		}
	}
	deletePredecessor(t, newClient(t, others), pred, "deleting the predecessor through the live members")
	start := time.Now()
	bound := ttl + 5*time.Second
	select {
	case r := <-res:
		t.Logf("the waiter returned %v after its predecessor's delete (its watch on frozen member %d): %v",
			time.Since(start).Round(time.Millisecond), on, r.err)
		if r.err != nil {
			t.Fatalf("the waiter's Acquire = %v, want the lock", r.err)
		}
		// Released through the live members, or left to its TTL.
		_ = r.le.Release(t.Context())
	case <-time.After(bound):
		cancel()
		if r := <-res; r.err == nil {
			_ = r.le.Release(t.Context())
		}
		t.Fatalf("the waiter was still queued %v after its predecessor was deleted (TTL %v; its watch on frozen member %d)", bound, ttl, on)
	}
}

// TestWaiterRidesOutQuorumLoss: right after a waiter has found its
// predecessor (and an unrelated write has landed, so that it reads the
// predecessor once more when its watch is created), its member loses the
// quorum for a few seconds: the other two members are paused. Reads made
// with a leader required fail at once there, and the waiter's watch is
// cancelled. Neither is a reason to give up while its lease (TTL 30s) may
// still live: the waiter stays queued and is granted once the quorum is
// back and its predecessor goes.
func TestWaiterRidesOutQuorumLoss(t *testing.T) {
	t.Parallel()
	c := faultCluster(t)
	eps := c.Endpoints()
	admin := newClient(t, eps)
	key := uniqueKey(t)
	pred := putPredecessor(t, admin, key, 120)
	// The waiter talks to one member only; the hook pauses the others.
	const x = 0
	var paused []int
	defer func() { unpauseAll(t, c, paused) }()
	hookErr := make(chan error, 1)
	cli := newClient(t, []string{c.Members[x].Addr()})
	d, err := etcd.NewDriver(t.Context(), cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	var once bool
	afterQueueRead(d, func() {
		if once {
			return
		}
		once = true
		_, err := admin.Put(t.Context(), key+".unrelated", "")
		if err == nil {
			err = pauseOthers(t.Context(), c, x, &paused)
		}
		hookErr <- err
	})
	w := mustNew(t, d, nil)
	t.Cleanup(func() { _ = w.Close() })

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res := make(chan error, 1)
	go func() {
		le, err := w.Acquire(ctx, key, &dlock.AcquireOptions{TTL: 30 * time.Second})
		if err == nil {
			err = le.Release(context.WithoutCancel(ctx))
		}
		res <- err
	}()
	select {
	case err := <-hookErr:
		if err != nil {
			t.Fatalf("pausing the other members: %v", err)
		}
	case err := <-res:
		t.Fatalf("the waiter's Acquire returned before it found its predecessor: %v", err)
	case <-time.After(slack):
		t.Fatal("the waiter did not read its queue")
	}
	// The waiter's member loses its leader within an election timeout
	// (1s); every read and watch there fails meanwhile.
	select {
	case err := <-res:
		t.Fatalf("the waiter's Acquire returned while its member had no quorum: %v", err)
	case <-time.After(5 * time.Second):
	}
	for _, i := range paused {
		if err := c.Members[i].Unpause(t.Context()); err != nil {
			t.Fatalf("unpausing member %d: %v", i, err)
		}
	}
	paused = nil
	deletePredecessor(t, admin, pred, "deleting the predecessor after the quorum came back")
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("the waiter's Acquire = %v, want the lock once the quorum is back", err)
		}
	case <-time.After(slack):
		cancel()
		<-res
		t.Fatal("the waiter was not granted after the quorum came back and its predecessor was deleted")
	}
}
