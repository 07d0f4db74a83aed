package matrix_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/tests/servers"
)

// Server crashes (issue 11, fault 2): the server that matters most (the
// only Redis, one Redlock node, the etcd or ZooKeeper leader, found by
// asking the servers), or a majority of the servers, is killed with
// SIGKILL and started again at once, while a victim client holds the lock
// and contenders keep trying.
//
// The victim holds one lease across the whole fault and then writes the
// fenced register and releases. Its lease is not refreshed: a 10s TTL
// outlasts the fault, so its Deadline stays where the grant put it and
// the outcome does not race a watchdog (on Redis, a refresh after the
// restart would find the key gone and end the lease at a moment that
// competes with the contenders' grant; without it, a contender granted
// after the restart always overlaps the victim's lease). ZooKeeper caps a
// lease at two thirds of the session timeout less a tick, so its crash
// cells ask for a session of 20s (crashZKSession) rather than the
// matrix's 6.3s: the 10s lease fits in it (bound 13.13s), as on etcd.
//
// After the victim's release the cell goes on until the contenders have
// been granted the lock crashHandoffs times, so that exclusion and token
// order are checked over a sequence of handoffs after the fault.
//
// Expected: the crash loses the lock's state on each killed server that
// keeps it only in memory (Redis and Redlock without persistence, or a
// Redis whose snapshot predates the grant), on none for etcd and
// ZooKeeper (a durable log); a violation when that is more servers than
// the backend tolerates losing. A safe cell must show the lock surviving
// the fault: it fails when the victim's lease ended before its release (a
// contender granted after that would show nothing).
func init() {
	register(&scenario{
		order:   20,
		name:    "KillRestart",
		row:     "server kill -9 and immediate restart (Redis: no persistence; Redlock: one node; etcd, ZooKeeper: the leader)",
		applies: all,
		expect:  crashExpect(crashLostMemory, "the lock lived only in the memory of its one server, and the restart lost it while its holder's lease was valid"),
		run:     func(t *testing.T, e *env) { runCrash(t, e, crashNoPersistence, crashLostMemory, crashLeader) },
	})
	register(&scenario{
		order:   21,
		name:    "KillRestartRDB",
		row:     "Redis kill -9 and restart with RDB snapshots",
		applies: only(bRedis),
		// The last snapshot was taken before the grant: the restart
		// restores the server without the lock.
		expect: crashExpect(crashLostOne,
			"the restart restored the last snapshot, taken before the lock was granted, so the lock was gone while its holder's lease was valid"),
		run: func(t *testing.T, e *env) { runCrash(t, e, crashRDB, crashLostOne, crashLeader) },
	})
	register(&scenario{
		order:   22,
		name:    "KillRestartAOF",
		row:     "Redis kill -9 and restart with AOF (appendfsync everysec)",
		applies: only(bRedis),
		// Redis writes (write(2)) every command to the AOF file before it
		// replies, in the event loop; appendfsync everysec only delays
		// the fsync. A kill -9 ends the process, not the kernel: what was
		// written sits in the page cache and is in the file when the
		// server starts again (only an OS crash or power loss loses the
		// last second). So the grant, acknowledged, survives: nothing is
		// lost. (Redis postpones the write, up to 2s, only while an fsync
		// of its own is still running on a slow disk; the run checks that
		// the lock is there after the restart.)
		expect: crashExpect(crashLostNone, ""),
		run:    func(t *testing.T, e *env) { runCrash(t, e, crashAOF, crashLostNone, crashLeader) },
	})
	// A majority crashes at once: Redlock's first three nodes of five, the
	// etcd or ZooKeeper leader and a follower (both found by asking the
	// servers). Not on Redis: its KillRestart row kills its whole
	// deployment already. Without persistence the three Redlock nodes come
	// back empty, more than the two Redlock tolerates losing; etcd and
	// ZooKeeper lose nothing (their log is on disk) but cannot serve while
	// two of three are down (the fault window: no progress is required
	// then; after the restart it is).
	register(&scenario{
		order:   23,
		name:    "KillRestartMajority",
		row:     "kill -9 and immediate restart of a majority (Redlock: 3 of 5 nodes; etcd, ZooKeeper: 2 of 3)",
		applies: only(bRedlock, bEtcd, bZooKeeper),
		expect: crashExpect(crashLostMajority,
			"three of five nodes restarted empty at once, so a majority no longer knew the lock and a second client got it while the first one's lease was valid (keep a crashed node down for a TTL, or persist with appendfsync always)"),
		run: func(t *testing.T, e *env) { runCrash(t, e, crashNoPersistence, crashLostMajority, crashMajority) },
	})
}

// crashLostMemory: Redis and Redlock servers without persistence restart
// empty; etcd and ZooKeeper keep their log on disk.
func crashLostMemory(b *backend) int {
	if b.name == bRedis || b.name == bRedlock {
		return 1
	}
	return 0
}

func crashLostOne(*backend) int  { return 1 }
func crashLostNone(*backend) int { return 0 }

// crashLostMajority: a majority of Redlock's nodes restart empty; etcd and
// ZooKeeper keep their log on disk.
func crashLostMajority(b *backend) int {
	if b.name == bRedlock {
		return b.nodes/2 + 1
	}
	return 0
}

// crashTargets picks the servers a crash cell kills; for etcd and
// ZooKeeper the leader comes first.
type crashTargets func(t *testing.T, e *env, d *deployment) []*servers.Server

// crashLeader picks the server whose crash matters most (deployment.leader).
func crashLeader(t *testing.T, _ *env, d *deployment) []*servers.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	srv, err := d.leader(ctx)
	if err != nil {
		t.Fatalf("finding the server to kill: %v", err)
	}
	return []*servers.Server{srv}
}

// crashMajority picks a majority: Redlock's first nodes, the etcd or
// ZooKeeper leader and a server that says it follows.
func crashMajority(t *testing.T, e *env, d *deployment) []*servers.Server {
	t.Helper()
	if e.b.name == bRedlock {
		return d.servers[:len(d.servers)/2+1]
	}
	leader := crashLeader(t, e, d)[0]
	for end := time.Now().Add(crashBound); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, s := range d.servers {
			if s != leader && crashFollows(t, e, d, s) {
				return []*servers.Server{leader, s}
			}
		}
	}
	t.Fatalf("no server said it follows the leader %v within %v", leader, crashBound)
	return nil
}

// crashFollows asks srv (etcd, ZooKeeper) whether it is a follower.
func crashFollows(t *testing.T, e *env, d *deployment, srv *servers.Server) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	switch e.b.name {
	case bEtcd:
		st, err := d.etcd.Status(ctx, srv.Addr())
		return err == nil && st.Leader != 0 && st.Header.MemberId != st.Leader
	case bZooKeeper:
		mode, _, err := zkState(srv.Addr())
		return err == nil && mode == "follower"
	}
	return false
}

// crashExpect derives a crash cell's expectation: a violation when the
// fault loses the lock's state on more servers than the backend tolerates
// losing (lost tells how many it loses on b), else safe.
func crashExpect(lost func(b *backend) int, why string) func(*backend, dlock.Guarantees) expectation {
	return func(b *backend, g dlock.Guarantees) expectation {
		if crashUnsafe(lost(b), g) {
			return expectation{violation, why}
		}
		return expectation{outcome: safe}
	}
}

// crashUnsafe reports whether losing the lock on lost servers exceeds what
// g tolerates.
func crashUnsafe(lost int, g dlock.Guarantees) bool { return lost > g.ToleratedFailures }

// crashPersistence is how the Redis servers of a crash cell persist.
type crashPersistence int

const (
	crashNoPersistence crashPersistence = iota // the deployment's default
	crashRDB                                   // snapshots, one taken before the grant
	crashAOF                                   // append-only file, fsync every second
)

const (
	// crashTTL is the victim's lease time: it outlasts the fault.
	crashTTL = 10 * time.Second
	// crashContenders is how many contenders keep trying.
	crashContenders = 3
	// crashBound bounds every wait of a crash run for something that
	// should happen in a second or two.
	crashBound = 15 * time.Second
	// crashZKSession is the ZooKeeper session timeout of a crash cell:
	// its TTL bound (20s - 20s/3 - zkTick) is above crashTTL, so the
	// victim's lease fits in the session without a refresh (the test
	// servers allow up to 120s).
	crashZKSession = 20 * time.Second
	// crashHandoffs is how many contender grants a cell waits for after
	// the victim's release, within crashHandoffsBound.
	crashHandoffs      = 10
	crashHandoffsBound = 30 * time.Second
)

// runCrash runs a crash cell: victim, contenders, kill -9 of the servers
// pick picks and their restart, recovery, the victim's write and release,
// and checks that the fault did what the expectation rests on.
func runCrash(t *testing.T, e *env, p crashPersistence, lost func(*backend) int, pick crashTargets) {
	ctx := t.Context()
	var d *deployment
	switch {
	case p == crashRDB:
		// Snapshots at most hourly: none but the explicit SAVE below.
		d = e.deploy(deployOptions{redisArgs: []string{"--dir", "/tmp", "--save", "3600 1", "--appendonly", "no"}})
	case p == crashAOF:
		d = e.deploy(deployOptions{redisArgs: []string{"--dir", "/tmp", "--appendonly", "yes", "--appendfsync", "everysec"}})
	case e.b.name == bZooKeeper:
		d = e.deploy(deployOptions{sessionTimeout: crashZKSession})
	default:
		d = e.deployment()
	}
	redisFamily := e.b.name == bRedis || e.b.name == bRedlock
	unsafe := crashUnsafe(lost(e.b), e.guarantees())
	lockKey := redis.DefaultPrefix + "{" + e.key + "}" // the same for Redlock
	fenceKey := lockKey + redisscript.FenceSuffix

	victimLocker := e.locker()
	vo := &dlock.AcquireOptions{TTL: crashTTL}
	if maxTTL := victimLocker.Limits().MaxTTL; maxTTL > 0 && maxTTL < crashTTL {
		t.Fatalf("the backend caps a lease at %v, below the victim's %v: the lease cannot outlast the fault without a refresh", maxTTL, crashTTL)
	}

	var saved int64 // RDB: the counter in the snapshot
	if p == crashRDB {
		// A grant the snapshot holds, then the snapshot: the victim's
		// grant comes after it.
		if err := e.cycle(ctx, "c0", e.locker(), &dlock.AcquireOptions{TTL: e.ttl}, crashBound, 0); err != nil {
			t.Fatalf("the grant before the snapshot: %v", err)
		}
		c := crashRedisClient(t, d.servers[0].Addr())
		if err := c.Save(ctx).Err(); err != nil {
			t.Fatalf("SAVE: %v", err)
		}
		var err error
		if saved, err = c.Get(ctx, fenceKey).Int64(); err != nil {
			t.Fatalf("the counter at the snapshot: %v", err)
		}
	}

	actx, cancel := context.WithTimeout(ctx, crashBound)
	victim, err := e.h.TryAcquire(actx, "victim", victimLocker, e.key, vo)
	cancel()
	if err != nil {
		t.Fatalf("the victim's acquire: %v", err)
	}
	read, ok := e.reg.Read(victim.Token())
	if !ok {
		t.Fatalf("the register refused the victim's token %d", victim.Token())
	}
	t.Logf("victim: token %d, TTL %v, valid for %v", victim.Token(), victim.TTL(),
		time.Until(victim.Deadline()).Round(time.Millisecond))

	crowd := crashStartCrowd(t, e, crashContenders, e.locker)
	isContender := func(op check.Op) bool { return crowd.names[op.Client] }
	lockers := append([]*dlock.Locker{victimLocker}, crowd.lockers...)
	crowd.awaitAllWaiting(t)

	srvs := pick(t, e, d)
	if n := lost(e.b); redisFamily && p != crashAOF && n != len(srvs) {
		t.Fatalf("the expectation counts %d servers losing the lock; the run kills %d", n, len(srvs))
	}
	before := crashLeadership(t, e, d, srvs[0])
	var owner string // Redis, Redlock: the victim's value in the lock key
	if redisFamily {
		owner = crashRedisGet(t, srvs[0].Addr(), lockKey)
		for _, srv := range srvs {
			if v := crashRedisGet(t, srv.Addr(), lockKey); owner == "" || v != owner {
				t.Fatalf("%v does not hold the victim's lock before the kill (%q, want %q): killing it shows nothing", srv, v, owner)
			}
		}
	}
	var names []string
	for _, srv := range srvs {
		names = append(names, srv.String())
	}
	what := strings.Join(names, ", ")

	if p == crashRDB {
		// The contenders hold off from just before the kill until the
		// counter has been read after the restart, so that the value read
		// is the one the snapshot restored (a contender's grant would
		// raise it).
		crowd.hold()
	}
	t.Logf("kill -9 %s", what)
	killed := time.Now()
	for _, srv := range srvs {
		if err := srv.Kill(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Started together: an etcd or ZooKeeper server that is back waits
	// for a quorum before it says it is ready.
	errs := make([]error, len(srvs))
	var wg sync.WaitGroup
	for i, srv := range srvs {
		wg.Go(func() {
			if err := srv.Start(ctx); err != nil {
				errs[i] = fmt.Errorf("restarting %v: %w", srv, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	// The fault lasts until every client reaches the servers again (for
	// etcd and ZooKeeper, once a leader is elected and the client has
	// reconnected), and 2s more for attempts already under way then.
	for _, l := range lockers {
		crashAwaitReachable(t, l)
	}
	recovered := time.Now()
	e.h.Fault("kill -9 and restart of "+what, killed, recovered.Add(2*time.Second))
	t.Logf("%s restarted %v after the kill; every client reached the servers again %v after it",
		what, restarted.Sub(killed).Round(time.Millisecond), recovered.Sub(killed).Round(time.Millisecond))
	crashCheckLeadership(t, e, d, srvs, before)

	// What the restart did to the lock on the killed servers.
	for _, srv := range srvs {
		if !redisFamily {
			break
		}
		// A contender may have taken a lost lock by now: compare values.
		has := crashRedisGet(t, srv.Addr(), lockKey) == owner
		switch {
		case p == crashAOF && !has:
			t.Fatalf("the lock is gone after a restart from the AOF file: the grant was not in it")
		case p == crashAOF:
			t.Logf("the lock survived the restart (loaded from the AOF file)")
		case has:
			t.Fatalf("the lock survived a restart without persistence of it (%v) on %v: nothing was lost, the cell shows nothing", p, srv)
		default:
			t.Logf("the restart lost the lock on %v", srv)
		}
	}
	if p == crashRDB {
		// The counter came back as the snapshot had it, below the
		// victim's token: the backend's clock floor alone keeps later
		// tokens above it (the checker checks the order).
		n, err := crashRedisClient(t, srvs[0].Addr()).Get(ctx, fenceKey).Int64()
		if err != nil {
			t.Fatalf("the counter after the restart: %v (did the snapshot load?)", err)
		}
		if n != saved || uint64(n) >= uint64(victim.Token()) {
			t.Fatalf("the counter after the restart is %d; want the snapshot's %d, below the victim's token %d (no stale counter, nothing shown)",
				n, saved, victim.Token())
		}
		t.Logf("the counter came back stale: %d, below the victim's token %d", n, victim.Token())
		crowd.resume()
	}

	if unsafe {
		// A contender takes the lock the restart lost while the victim's
		// lease is valid.
		e.awaitOps(t, crashBound, "contender's grant after the restart", func(ops []check.Op) bool {
			return crashHas(ops, func(op check.Op) bool { return op.Granted() && isContender(op) && op.End.After(restarted) })
		})
		if !time.Now().Before(victim.Deadline()) {
			t.Fatalf("the victim's lease ran out (Deadline %v) before a contender's grant was seen: no overlap shown", victim.Deadline())
		}
	} else {
		// The victim's critical section goes on for a second after the
		// recovery, while the contenders try the servers again.
		time.Sleep(time.Second)
	}

	if !unsafe && victim.Err() != nil {
		// Safe only if the lock outlasted the fault: a lease that ended
		// lets a contender in without any overlap, whatever the servers
		// did, and the cell would pass without showing anything.
		t.Fatalf("the victim's lease ended during the fault (%v; Deadline %v, %v after the kill): the cell must show the lock surviving the fault, "+
			"with its holder's lease valid until the release", victim.Err(), victim.Deadline().Format("15:04:05.000"),
			victim.Deadline().Sub(killed).Round(time.Millisecond))
	}
	e.reg.Write(victim.Client(), victim.ID(), victim.Token(), victim.Deadline(), read)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	released := time.Now()
	left := victim.Deadline().Sub(released)
	err = victim.Release(rctx)
	cancel()
	switch {
	case !unsafe && err != nil:
		t.Errorf("the victim's Release (its lease valid across the restart): %v", err)
	case err != nil:
		t.Logf("the victim's Release: %v", err)
	}
	if !unsafe {
		// A contender that waited while the victim held the lock after
		// the restart gets it once released.
		e.awaitOps(t, crashBound, "grant, after the victim's release, of a contender that waited for it", func(ops []check.Op) bool {
			return crashHas(ops, func(op check.Op) bool {
				return op.Granted() && isContender(op) && op.Start.Before(released) && op.End.After(released)
			})
		})
		t.Logf("the victim held the lock across the restart (released %v after the kill, its lease valid for %v more); "+
			"a contender that waited was granted after its release", released.Sub(killed).Round(time.Millisecond), left.Round(time.Millisecond))
	}
	// The contenders take turns after the release: a handoff sequence
	// for the checker.
	e.awaitOps(t, crashHandoffsBound, fmt.Sprintf("%d contender grants after the victim's release", crashHandoffs), func(ops []check.Op) bool {
		return crashCount(ops, func(op check.Op) bool { return op.Granted() && isContender(op) && op.End.After(released) }) >= crashHandoffs
	})
	t.Logf("%d contender grants %v after the victim's release", crashHandoffs, time.Since(released).Round(time.Millisecond))
	crashOnlyOverlap(t, e)
}

func (p crashPersistence) String() string {
	switch p {
	case crashRDB:
		return "RDB"
	case crashAOF:
		return "AOF"
	}
	return "none"
}

// crashCrowd is a cell's contenders: each with a Locker of its own (as a
// separate process would have), taking the key over and over (e.cycle)
// with acquires that wait as long as it takes. The run can hold them off.
type crashCrowd struct {
	names   map[string]bool
	lockers []*dlock.Locker

	mu     sync.Mutex
	round  context.Context // cancelled by hold
	cancel context.CancelFunc
	open   chan struct{}   // non-nil while held; closed by resume
	active map[string]bool // contenders in a cycle
	busy   sync.WaitGroup  // cycles in progress
}

// crashStartCrowd starts n contenders, c1 … cn, over Lockers made by mk;
// e.stopAll ends them (their acquires are cancelled).
func crashStartCrowd(t *testing.T, e *env, n int, mk func() *dlock.Locker) *crashCrowd {
	cs := contenders(n, "c", &dlock.AcquireOptions{TTL: e.ttl})
	for i := range cs {
		cs[i].name = fmt.Sprintf("c%d", i+1)
	}
	return crashStartCrowdOf(t, e, cs, mk)
}

// crashStartCrowdOf starts the contenders cs (each with its own options:
// a semaphore's permits, readers and writers) over Lockers made by mk.
func crashStartCrowdOf(t *testing.T, e *env, cs []contender, mk func() *dlock.Locker) *crashCrowd {
	c := &crashCrowd{names: map[string]bool{}, active: map[string]bool{}}
	c.round, c.cancel = context.WithCancel(context.Background())
	t.Cleanup(func() { c.cancel() })
	for _, ct := range cs {
		l := mk()
		name, o := ct.name, ct.o
		c.names[name] = true
		c.lockers = append(c.lockers, l)
		e.goStop(func(stop <-chan struct{}) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go func() {
				select {
				case <-stop:
				case <-ctx.Done():
				}
				cancel()
			}()
			for ctx.Err() == nil {
				cctx, exit, ok := c.enter(ctx, name)
				if !ok {
					return
				}
				err := e.cycle(cctx, name, l, o, time.Minute, 10*time.Millisecond)
				exit()
				if errors.Is(err, dlock.ErrUnavailable) {
					// The servers are down: do not spin.
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
		})
	}
	return c
}

// enter starts a cycle of contender name, waiting while the crowd is
// held: it returns the cycle's context (cancelled by hold) and the
// function that ends the cycle, or false when ctx ended first.
func (c *crashCrowd) enter(ctx context.Context, name string) (context.Context, func(), bool) {
	for {
		c.mu.Lock()
		if c.open == nil {
			c.busy.Add(1)
			c.active[name] = true
			round := c.round
			c.mu.Unlock()
			cctx, cancel := context.WithCancel(ctx)
			stop := context.AfterFunc(round, cancel)
			return cctx, func() {
				stop()
				cancel()
				c.mu.Lock()
				delete(c.active, name)
				c.mu.Unlock()
				c.busy.Done()
			}, true
		}
		open := c.open
		c.mu.Unlock()
		select {
		case <-open:
		case <-ctx.Done():
			return nil, nil, false
		}
	}
}

// hold cancels the contenders' cycles in progress, waits for them to end,
// and keeps new ones from starting until resume.
func (c *crashCrowd) hold() {
	c.mu.Lock()
	c.open = make(chan struct{})
	c.cancel()
	c.mu.Unlock()
	c.busy.Wait()
}

// resume lets the contenders go on after hold.
func (c *crashCrowd) resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.round, c.cancel = context.WithCancel(context.Background())
	close(c.open)
	c.open = nil
}

// awaitAllWaiting waits until every contender is in a cycle (each waits
// for the victim's lock).
func (c *crashCrowd) awaitAllWaiting(t *testing.T) {
	t.Helper()
	for end := time.Now().Add(crashBound); ; time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		n := len(c.active)
		c.mu.Unlock()
		if n == len(c.names) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d contenders started an acquire within %v", n, len(c.names), crashBound)
		}
	}
}

// crashOnlyOverlap fails t if the history so far breaks a safety property
// other than mutual exclusion: a crash may let two holders overlap where
// the Guarantees admit it, but tokens must still rise and the register
// must refuse the holder that lost the lock (the cell's outcome alone
// would not tell a token-order violation from the overlap).
func crashOnlyOverlap(t *testing.T, e *env) {
	t.Helper()
	crashOnly(t, e, check.MutualExclusion)
}

// crashOnly fails t if the history so far breaks a safety property other
// than allowed (a semaphore's crash cell: the permit count).
func crashOnly(t *testing.T, e *env, allowed check.Property) {
	t.Helper()
	for _, v := range check.Check(e.h, check.Options{}) {
		if v.Property.Safety() && v.Property != allowed {
			t.Errorf("%v", v)
		}
	}
}

// crashAwaitRedis polls INFO on the Redis server at addr until it reports
// want, failing t (waiting for what) after crashBound.
func crashAwaitRedis(t *testing.T, addr, want, what string) {
	t.Helper()
	c := crashRedisClient(t, addr)
	var (
		info string
		err  error
	)
	for end := time.Now().Add(crashBound); ; time.Sleep(20 * time.Millisecond) {
		if info, err = c.Info(t.Context(), "replication").Result(); err == nil && strings.Contains(info, want) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("waiting for %s: no %q in INFO replication of %s within %v: %q, %v", what, want, addr, crashBound, info, err)
		}
	}
}

// crashCount returns how many ops of ops match.
func crashCount(ops []check.Op, match func(check.Op) bool) int {
	n := 0
	for _, op := range ops {
		if match(op) {
			n++
		}
	}
	return n
}

// crashHas reports whether an op of ops matches.
func crashHas(ops []check.Op, match func(check.Op) bool) bool {
	for _, op := range ops {
		if match(op) {
			return true
		}
	}
	return false
}

// crashAwaitReachable waits until l's own client reaches the servers: a
// Redis PING (every Redlock node), a linearizable etcd read (it needs a
// leader), a ZooKeeper session.
func crashAwaitReachable(t *testing.T, l *dlock.Locker) {
	t.Helper()
	probe := func(ctx context.Context) error {
		var zc *zk.Conn
		var ec *clientv3.Client
		var rc goredis.UniversalClient
		var rcs []goredis.UniversalClient
		switch {
		case driver.LockerAs(l, &zc):
			if st := zc.State(); st != zk.StateHasSession {
				return fmt.Errorf("zookeeper: %v", st)
			}
			return nil
		case driver.LockerAs(l, &ec):
			_, err := ec.Get(ctx, "dlock-matrix-probe")
			return err
		case driver.LockerAs(l, &rc):
			return rc.Ping(ctx).Err()
		case driver.LockerAs(l, &rcs):
			var errs []error
			for _, c := range rcs {
				errs = append(errs, c.Ping(ctx).Err())
			}
			return errors.Join(errs...)
		}
		return errors.New("no client to probe")
	}
	var err error
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err = probe(ctx)
		cancel()
		if err == nil {
			return
		}
	}
	t.Fatalf("a client did not reach the servers again within 30s: %v", err)
}

// crashRedisClient returns a client of the Redis server at addr, closed
// when the cell ends.
func crashRedisClient(t *testing.T, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// crashRedisGet returns the ownership value in the lock key key on the
// Redis server at addr, "" if it has none. A waiter's mark on the value
// (a '+' appended, see acquire.lua) is dropped.
func crashRedisGet(t *testing.T, addr, key string) string {
	t.Helper()
	v, err := crashRedisClient(t, addr).Get(t.Context(), key).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		t.Fatalf("GET on %s: %v", addr, err)
	}
	return strings.TrimSuffix(v, "+")
}

// crashLeadership returns the term (etcd) or epoch (ZooKeeper) of srv,
// which leads now, or 0 for Redis and Redlock (no leader).
func crashLeadership(t *testing.T, e *env, d *deployment, srv *servers.Server) uint64 {
	t.Helper()
	switch e.b.name {
	case bEtcd:
		st, err := d.etcd.Status(t.Context(), srv.Addr())
		if err != nil {
			t.Fatalf("status of %v: %v", srv, err)
		}
		if st.Header.MemberId != st.Leader {
			t.Fatalf("%v is not the leader (the leader is %x)", srv, st.Leader)
		}
		return st.RaftTerm
	case bZooKeeper:
		mode, epoch, err := zkState(srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if mode != "leader" {
			t.Fatalf("%v is a %s, not the leader", srv, mode)
		}
		return epoch
	}
	return 0
}

// crashCheckLeadership checks, after the restart, that the killed servers
// (the first of which led in term or epoch before) serve again, and that
// an election has happened: the leader now leads in a later term or epoch.
func crashCheckLeadership(t *testing.T, e *env, d *deployment, srvs []*servers.Server, before uint64) {
	t.Helper()
	if e.b.name != bEtcd && e.b.name != bZooKeeper {
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, killed := range srvs {
		crashAwaitServing(t, e, d, killed)
	}
	leader, err := d.leader(ctx)
	if err != nil {
		t.Fatalf("no leader after the restart: %v", err)
	}
	after := crashLeadership(t, e, d, leader)
	if after <= before {
		t.Fatalf("the leader's term/epoch is %d after the kill, %d before: no election happened", after, before)
	}
	t.Logf("the killed leader led in term/epoch %d; after the restart %v leads in %d, and the killed servers serve again", before, leader, after)
}

// crashAwaitServing waits until the killed server (etcd, ZooKeeper) serves
// again.
func crashAwaitServing(t *testing.T, e *env, d *deployment, killed *servers.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for end := time.Now().Add(crashBound); ; time.Sleep(100 * time.Millisecond) {
		var err error
		switch e.b.name {
		case bEtcd:
			_, err = d.etcd.Status(ctx, killed.Addr())
		case bZooKeeper:
			var mode string
			if mode, _, err = zkState(killed.Addr()); err == nil && mode != "leader" && mode != "follower" {
				err = fmt.Errorf("%v is %q", killed, mode)
			}
		}
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the killed server %v did not serve again within %v: %v", killed, crashBound, err)
		}
	}
}
