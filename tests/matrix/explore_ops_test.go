package matrix_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/testhook"
	"github.com/dlock-go/dlock/tests/servers"
)

// exploreClients is how many clients a run has, each a Locker of its own
// through proxies of its own; exploreKeys how many lock keys they share
// (bursts use the first two).
const (
	exploreClients = 4
	exploreKeys    = 3
)

// explorer is one run of TestExplore.
type explorer struct {
	exploreStats
	t    *testing.T
	e    *env
	seed uint64
	g    dlock.Guarantees
	keys []string
	regs map[string]*check.Register
	// ttls are the TTLs clients ask for; autoMin the least one asked
	// with AutoRefresh; maxTTL the longest.
	ttls           []time.Duration
	autoMin        time.Duration
	maxTTL         time.Duration
	minReq         int // OneShot.MinBytes of the backend's protocol
	end            time.Time
	audit          *auditor
	clients        []*xclient
	nemesisServers bool // server faults (kill, pause) are drawn
	// shares are the keys that may also be taken shared, and how (see
	// explore_shared_test.go); empty on a backend without shared leases.
	shares map[string]xshare
	// expire drops a key's lock as an expiry would (the deployment's
	// expire; on Redis, every shared holder's too): whether it dropped
	// any, and the tokens of the leases it dropped (a 0 where it cannot
	// tell).
	expire func(ctx context.Context, key string) (bool, []dlock.Token, error)
	// resets: faults may reset a client's connections (Cut, FailNext,
	// a server killed, a cut-off long enough for the client to
	// reconnect, a ZooKeeper member paused past the ensemble's sync
	// limit), and a client's Locker may be closed during an
	// operation. Not on ZooKeeper in a binary built with -race: the
	// go-zookeeper client (v1.0.4) has a data race on Conn.lastZxid
	// between recvLoop and sendSetWatches when it reconnects with
	// watches set (reported upstream, unfixed), and one on a request's
	// response when Close fails the request (CreateContainer returns
	// the response while recvLoop may still be decoding the server's
	// answer into it); the race detector fails the run on either,
	// though neither is dlock's. Without -race they are drawn on
	// ZooKeeper too: scripts/test.sh runs the ZooKeeper explorer a
	// second time without -race (and `make explore`/`make soak` do
	// with RACE=off).
	resets bool

	mu       sync.Mutex
	findings []finding
	crashes  []time.Time          // server kills, for admits
	expires  []keyWindow          // locks the explorer dropped
	probes   []keyWindow          // permits mismatches asked (see mismatch)
	sfaults  []window             // server faults
	cfaults  map[string][]window  // faults on a client's proxies, by client
	leases   map[int]exploreLease // by the ID of the granting acquire
	// failedRelease lists, by etcd lease, the leases it carried whose
	// Release failed.
	failedRelease map[clientv3.LeaseID][]int
	traces        map[int][]string // by lease, see trace
}

// finding is a broken per-operation invariant, seen between from and to.
type finding struct {
	lease    int // the ID of the acquire that granted the lease concerned
	from, to time.Time
	kind     string // the invariant, for the counts
	what     string
}

type window struct{ from, to time.Time }

type keyWindow struct {
	key string
	window
}

type exploreLease struct {
	asked time.Duration
	auto  bool
	// etcd: the etcd lease the grant came on (etcd.OwnerOf), else 0
	etcd clientv3.LeaseID
	// unknown: a Refresh failed with an unknown outcome
	unknown bool
	granted time.Time // when the grant was recorded
	share   xshare    // how the key was taken
}

// granted records a grant.
func (x *explorer) granted(le *check.Lease, asked time.Duration, auto bool, sh xshare) {
	x.add("grant")
	if sh.shared {
		x.add("grant shared (" + sh.String() + ")")
	}
	var id clientv3.LeaseID
	if own, ok := etcd.OwnerOf(le.Lease); ok {
		id = own.Lease
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.leases[le.ID()] = exploreLease{asked: asked, auto: auto, etcd: id, granted: time.Now(), share: sh}
}

// refreshed records the outcome of a Refresh of le to ttl, invoked at
// start, in the lease's trace: one that failed otherwise than with
// ErrNotHeld left it unknown.
func (x *explorer) refreshed(le *check.Lease, ttl time.Duration, start time.Time, err error) {
	x.trace(le.ID(), "Refresh(%v) %s..%s: %v; Deadline %s", ttl, x.at(start), x.at(time.Now()), err, x.at(le.Deadline()))
	x.mu.Lock()
	defer x.mu.Unlock()
	l := x.leases[le.ID()]
	l.unknown = l.unknown || (err != nil && !errors.Is(err, dlock.ErrNotHeld))
	x.leases[le.ID()] = l
}

// at formats t relative to the history's start.
func (x *explorer) at(t time.Time) string {
	return "+" + t.Sub(x.e.h.Begin()).Round(time.Millisecond).String()
}

// trace notes what happened to lease id (what the history does not
// record: refreshes, releases), for failure reports; the last 30 notes
// per lease are kept.
func (x *explorer) trace(id int, format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	tr := append(x.traces[id], fmt.Sprintf(format, args...))
	if len(tr) > 30 {
		tr = tr[len(tr)-30:]
	}
	x.traces[id] = tr
}

// releaseFailed records a Release of le that failed (the lock may or may
// not be free, and the backend may still be cleaning up).
func (x *explorer) releaseFailed(le *check.Lease) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if id := x.leases[le.ID()].etcd; id != 0 {
		x.failedRelease[id] = append(x.failedRelease[id], le.ID())
	}
}

// carried says which leases, granted before lease id on the same etcd
// lease, had a Release that failed ("" if none, or not etcd).
func (x *explorer) carried(id int) string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var before []string
	for _, b := range x.failedRelease[x.leases[id].etcd] {
		if b < id {
			before = append(before, fmt.Sprintf("#%d", b))
		}
	}
	if len(before) == 0 {
		return ""
	}
	return fmt.Sprintf("; its etcd lease %x carried lease %s before, whose Release failed", int64(x.leases[id].etcd), strings.Join(before, ", "))
}

// setMaxDirWatches sets how many lock directories an etcd Locker opened
// from then on watches before it watches the whole prefix, and returns the
// number it replaces.
var setMaxDirWatches = testhook.Get[func(int) int]("etcd.SetMaxDirWatches")

func newExplorer(t *testing.T, e *env, seed uint64) *explorer {
	x := &explorer{t: t, e: e, seed: seed, regs: map[string]*check.Register{},
		cfaults: map[string][]window{}, leases: map[int]exploreLease{}, failedRelease: map[clientv3.LeaseID][]int{}, traces: map[int][]string{}, nemesisServers: true,
		resets: e.b.name != bZooKeeper || !servers.RaceDetector}
	for i := range exploreKeys {
		k := fmt.Sprintf("x%d-k%d", seed%100000, i)
		x.keys = append(x.keys, k)
		x.regs[k] = check.NewRegister(e.h, k)
	}
	switch e.b.name {
	case bEtcd:
		// Long TTLs too: a lease must outlast a 2s request timeout
		// (etcd's clean-ups) cut off from the servers to show what
		// happens after.
		x.ttls, x.autoMin, x.minReq = []time.Duration{2 * time.Second, 3 * time.Second, 5 * time.Second, 8 * time.Second}, 2*time.Second, 30
		// How many lock directories a Locker watches before it
		// watches the whole prefix too, from the seed (not from the
		// clients' draws): with 1 or 2, the run's few keys take the
		// prefix watch, the eviction of a lingering directory watch
		// and its reuse; 64 is the default.
		n := []int{1, 2, 64}[seed%3]
		old := setMaxDirWatches(n)
		t.Cleanup(func() { setMaxDirWatches(old) })
		t.Logf("etcd: %d directory watches per Locker before the prefix watch", n)
	case bZooKeeper:
		x.ttls, x.autoMin, x.minReq = []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}, 2*time.Second, 20
	default:
		x.ttls, x.autoMin, x.minReq = []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second}, time.Second, 8
	}
	x.maxTTL = x.ttls[len(x.ttls)-1]
	d := e.deployment()
	x.audit = newAuditor(t, e.b, d)
	for i := range exploreClients {
		c := &xclient{x: x, name: fmt.Sprintf("c%d", i), rng: rand.New(rand.NewPCG(seed, uint64(i+1))),
			own: fmt.Sprintf("x%d-c%d", seed%100000, i)}
		x.regs[c.own] = check.NewRegister(e.h, c.own)
		targets := d.addrs()
		if e.b.name == bEtcd {
			// One member each: a one-shot fault then hits the client's
			// one connection, whatever the balancer would pick.
			targets = targets[i%len(targets) : i%len(targets)+1]
		}
		for _, a := range targets {
			p, err := servers.NewProxy(a)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			c.ps = append(c.ps, p)
			c.addrs = append(c.addrs, p.Addr())
		}
		c.l = e.lockerAt(c.addrs)
		x.clients = append(x.clients, c)
	}
	x.g = x.clients[0].l.Guarantees()
	// Only TTLs the backend grants (ZooKeeper: two thirds of the session
	// timeout at most).
	lim := x.clients[0].l.Limits()
	x.ttls = slices.DeleteFunc(x.ttls, func(d time.Duration) bool { return d < lim.MinTTL || (lim.MaxTTL > 0 && d > lim.MaxTTL) })
	if len(x.ttls) == 0 {
		t.Fatalf("no TTL of the explorer's is within the backend's limits %+v", lim)
	}
	x.maxTTL = x.ttls[len(x.ttls)-1]
	x.autoMin = min(x.autoMin, x.maxTTL)
	x.setShares()
	x.expire = func(ctx context.Context, key string) (bool, []dlock.Token, error) {
		dropped, tok, err := d.expire(ctx, key)
		return dropped, []dlock.Token{tok}, err
	}
	if e.b.name == bRedis && x.g.Shared {
		// The deployment's expire deletes the lock key only, and names
		// the last grant's token: of shared holders, it would drop them
		// all and name one (or none of them).
		x.expire = redisExpireShared(t, d.servers[0])
	}
	return x
}

// run lets the clients and the nemesis go for budget, then heals every
// proxy and closes every Locker.
func (x *explorer) run(budget time.Duration) {
	x.end = time.Now().Add(budget)
	var wg sync.WaitGroup
	for _, c := range x.clients {
		wg.Go(c.loop)
	}
	wg.Go(x.nemesis)
	wg.Wait()
	for _, c := range x.clients {
		for _, p := range c.ps {
			p.Heal()
		}
		c.mu.Lock()
		l := c.l
		c.mu.Unlock()
		_ = l.Close()
	}
}

// find records a finding (about lease, the ID of its acquire; 0 for
// none), naming the lease's share when it is a shared one.
func (x *explorer) find(lease int, from, to time.Time, kind, format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	what := fmt.Sprintf(format, args...)
	if sh := x.leases[lease].share; sh.shared {
		what += " [the lease: a " + sh.String() + "]"
	}
	x.findings = append(x.findings, finding{lease: lease, from: from, to: to, kind: kind, what: what})
}

// The kinds of finding.
const (
	kindShortGrant  = "grant's TTL below the asked"
	kindPastExpiry  = "Deadline past the server's expiry"
	kindGoneHeld    = "lock gone while held"
	kindStillThere  = "released lock still there"
	kindEarlyLoss   = "lease lost before its Deadline"
	kindAutoLost    = "auto-refreshed lease lost without a fault"
	kindSecondRelOK = "second Release returned nil"
)

func (x *explorer) asked(id int) time.Duration {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.leases[id].asked
}

// isAuto reports whether lease id was auto-refreshed (also when refreshed
// by hand to another TTL: the watchdog then plans its next refresh by the
// new Deadline).
func (x *explorer) isAuto(id int) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.leases[id].auto
}

// expiredBetween reports whether the explorer dropped key's lock between
// from and to.
func (x *explorer) expiredBetween(key string, from, to time.Time) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, w := range x.expires {
		if w.key == key && !w.from.After(to) && !w.to.Before(from) {
			return true
		}
	}
	return false
}

// faultedBetween reports whether a server fault, or a fault on client's
// proxies, overlapped from..to.
func (x *explorer) faultedBetween(client string, from, to time.Time) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	over := func(ws []window) bool {
		for _, w := range ws {
			if !w.from.After(to) && !w.to.Before(from) {
				return true
			}
		}
		return false
	}
	return over(x.sfaults) || over(x.cfaults[client])
}

// xclient is one client: a Locker through proxies of its own, and a
// random source of its own (seeded by the run's seed and its number).
type xclient struct {
	x    *explorer
	name string
	own  string     // a key only this client takes
	rng  *rand.Rand // used by the client's goroutine only
	ps   []*servers.Proxy

	addrs []string
	// faultMu is held while a fault is on the client's proxies, so the
	// nemesis and the client's own faults do not heal each other's.
	faultMu sync.Mutex
	// disarm ends the watchers of an armed one-shot fault (under faultMu).
	disarm   chan struct{}
	watchers sync.WaitGroup

	mu sync.Mutex
	l  *dlock.Locker // replaced after a Close
	// follow, after a Release cut off from the servers: the next hold is
	// on this key and TTL (the etcd lease pool hands the lease out again).
	follow *exploreFollow
}

// exploreFollow is a hold that must come next: on the client's own key
// (so that no holder delays it), with the TTL of the lease released (so
// that the etcd lease pool hands that lease out again).
type exploreFollow struct {
	key string
	ttl time.Duration
}

func (c *xclient) locker() *dlock.Locker {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.l
}

func (c *xclient) pickTTL() time.Duration { return c.x.ttls[c.rng.IntN(len(c.x.ttls))] }

// loop draws operations until the run's end.
func (c *xclient) loop() {
	x := c.x
	for time.Now().Before(x.end) && x.t.Context().Err() == nil {
		if f := c.follow; f != nil {
			c.follow = nil
			c.hold(c.locker(), f.key, f.ttl, true)
			continue
		}
		switch r := c.rng.IntN(20); {
		case r < 5:
			c.burst()
		case r < 13:
			c.hold(c.locker(), x.keys[c.rng.IntN(len(x.keys))], c.pickTTL(), false)
		case r < 17:
			// A long lease on the client's own key: nobody waits for
			// it, so whatever ends it early is the lock's doing.
			c.hold(c.locker(), c.own, x.ttls[len(x.ttls)/2+c.rng.IntN(len(x.ttls)-len(x.ttls)/2)], c.rng.IntN(2) == 0)
		case r < 18 && x.resets:
			c.closeDuring()
		default:
			time.Sleep(time.Duration(c.rng.IntN(200)) * time.Millisecond)
		}
	}
}

// acquire takes key for ttl (Acquire if wait, else TryAcquire) and checks
// the grant.
func (c *xclient) acquire(l *dlock.Locker, key string, ttl time.Duration, auto, wait bool, within time.Duration, sh xshare) *check.Lease {
	x := c.x
	ctx, cancel := context.WithTimeout(x.t.Context(), within)
	defer cancel()
	o := sh.options(ttl, auto)
	var (
		le  *check.Lease
		err error
	)
	if sh.shared {
		x.add("op acquire shared")
	}
	start := time.Now()
	if wait {
		x.add("op acquire")
		le, err = x.e.h.Acquire(ctx, c.name, l, key, o)
	} else {
		x.add("op try-acquire")
		le, err = x.e.h.TryAcquire(ctx, c.name, l, key, o)
	}
	if err != nil {
		var pe *dlock.PermitsError
		if errors.As(err, &pe) && !x.probing(key, start, time.Now()) {
			// Every acquire of the key asks for its one Permits; the
			// mismatches are asked on purpose elsewhere (mismatch).
			x.find(0, start, time.Now(), kindMismatchSpurious, "acquire (%s, key %q) of a %v failed with a PermitsError, though every request on the key asks for that, and no mismatch was asked meanwhile: %v", c.name, key, sh, err)
		}
		return nil
	}
	x.granted(le, ttl, auto, sh)
	if x.carried(le.ID()) != "" {
		x.add("grant on an etcd lease whose Release failed before")
	}
	// The grant has the TTL asked, or at least nine tenths of it (etcd:
	// a pooled lease renewed within its last tenth).
	if got := le.TTL(); got < ttl-ttl/10-time.Millisecond {
		x.find(le.ID(), time.Now(), time.Now(), kindShortGrant, "lease #%d (%s, key %q, token %d): asked TTL %v, granted %v", le.ID(), c.name, key, le.Token(), ttl, got)
	}
	c.auditLease(le, ttl)
	return le
}

// auditLease checks le against the servers: its lock is there and its
// Deadline is not past the server's expiry for it.
func (c *xclient) auditLease(le *check.Lease, asked time.Duration) {
	x := c.x
	dl := le.Deadline()
	start := time.Now()
	if le.Err() != nil || dl.Sub(start) < 200*time.Millisecond {
		return
	}
	ctx, cancel := context.WithTimeout(x.t.Context(), 5*time.Second)
	defer cancel()
	x.add("audit")
	problem, err := x.audit.held(ctx, le, dl)
	if err != nil {
		x.add("audit unanswered") // the servers could not say (a fault); counted so that a broken probe shows
	}
	if err != nil || problem == "" {
		return
	}
	if !le.Deadline().Equal(dl) || le.Err() != nil {
		// A refresh (the watchdog's) moved the Deadline, or the lease
		// ended, while the servers were asked: the answer may be
		// about another expiry.
		return
	}
	if x.expiredBetween(le.Key(), start.Add(-time.Minute), time.Now()) {
		return // the explorer dropped locks on the key: the lease may be gone
	}
	kind := kindPastExpiry
	if strings.Contains(problem, "gone") {
		kind = kindGoneHeld
	}
	x.mu.Lock()
	from := earliest(x.leases[le.ID()].granted, start) // the faults of the lease's life count
	x.mu.Unlock()
	x.find(le.ID(), from, time.Now(), kind, "lease #%d (%s, key %q, token %d, TTL %v asked %v, Deadline %v ahead): %s",
		le.ID(), c.name, le.Key(), le.Token(), le.TTL(), asked, dl.Sub(start).Round(time.Millisecond), problem)
}

// hold acquires key, holds it a while doing random things, and releases
// it in a random way. long: a long hold.
func (c *xclient) hold(l *dlock.Locker, key string, ttl time.Duration, long bool) {
	x := c.x
	auto := ttl >= x.autoMin && (long || c.rng.IntN(2) == 0)
	wait := c.rng.IntN(3) > 0
	sh := c.shareFor(key)
	le := c.acquire(l, key, ttl, auto, wait, time.Duration(1+c.rng.IntN(10))*time.Second, sh)
	if le == nil {
		return
	}
	// How long to hold: an auto-refreshed lease up to 3 TTLs; another
	// mostly within its TTL, and sometimes past it (the lease then ends
	// at its Deadline).
	var d time.Duration
	switch r := c.rng.IntN(10); {
	case long && auto:
		d = ttl + time.Duration(c.rng.Int64N(int64(2*ttl)))
	case r < 4:
		d = time.Duration(c.rng.IntN(100)) * time.Millisecond
	case r < 7 || (!auto && r < 9):
		d = time.Duration(c.rng.Int64N(int64(ttl / 2)))
	case auto:
		d = ttl + time.Duration(c.rng.Int64N(int64(2*ttl)))
	default:
		d = ttl/2 + time.Duration(c.rng.Int64N(int64(ttl)))
	}
	ctx := x.t.Context()
	lost := 1 // in 20: a refresh to another TTL with an unknown outcome
	if auto && ttl >= x.ttls[len(x.ttls)/2] {
		// Then the watchdog refreshes the lease, as it knows it; a
		// long TTL outlasts the partition.
		lost = 4
	}
	extended := false
	stop := x.end.Add(3 * x.maxTTL) // the run is over: wind down
	for end := time.Now().Add(d); time.Now().Before(end) && time.Now().Before(stop) && ctx.Err() == nil && le.Err() == nil; {
		switch r := c.rng.IntN(20); {
		case r < 3:
			c.refresh(le, 0, ttl)
		case r < 5:
			c.refresh(le, c.otherTTL(ttl), ttl)
		case r < 5+lost:
			other := c.shorterTTL(ttl)
			c.refreshLost(le, other, ttl)
			// Hold on past the other TTL (once): a lease kept alive on
			// the wrong lease shows when that one ends.
			if !extended {
				end, extended = latest(end, time.Now().Add(other+ttl+time.Second)), true
			}
		case r < 9+lost && sh.shared && c.rng.IntN(8) == 0:
			c.mismatch(le, sh)
		case r < 9+lost && sh.shared:
			c.sharedCritical(le, sh, time.Duration(c.rng.IntN(50))*time.Millisecond)
		case r < 9+lost:
			x.regs[key].Update(ctx, le, time.Duration(c.rng.IntN(50))*time.Millisecond)
		default:
			time.Sleep(time.Duration(50+c.rng.IntN(350)) * time.Millisecond)
			c.auditLease(le, ttl)
		}
	}
	c.release(le, key, ttl)
}

// shorterTTL draws a TTL from ttl/2 up to below ttl if there is one,
// else another TTL: a lease left on it ends before the one asked first,
// but not before the partition of refreshLost does.
func (c *xclient) shorterTTL(ttl time.Duration) time.Duration {
	var in []time.Duration
	for _, o := range c.x.ttls {
		if o >= ttl/2 && o < ttl {
			in = append(in, o)
		}
	}
	if len(in) == 0 {
		return ttl
	}
	return in[c.rng.IntN(len(in))]
}

func (c *xclient) otherTTL(ttl time.Duration) time.Duration {
	for {
		if o := c.pickTTL(); o != ttl {
			return o
		}
	}
}

// refresh refreshes le to ttl (0: as acquired) and audits it.
func (c *xclient) refresh(le *check.Lease, ttl, asked time.Duration) {
	x := c.x
	if ttl == 0 {
		x.add("op refresh")
	} else {
		x.add("op refresh-other-ttl")
	}
	ctx, cancel := context.WithTimeout(x.t.Context(), 5*time.Second)
	start := time.Now()
	err := le.Refresh(ctx, ttl)
	cancel()
	x.refreshed(le, ttl, start, err)
	if err == nil {
		if ttl != 0 {
			asked = ttl
		}
		c.auditLease(le, asked)
	}
}

// refreshLost refreshes le to another TTL while the reply to one of its
// requests (by the draw: etcd's lease grant or its move transaction) is
// dropped and the client is cut off from then on, for longer than a
// read-back of the outcome may take (an unknown outcome); then the link
// heals and the hold goes on.
func (c *xclient) refreshLost(le *check.Lease, ttl, asked time.Duration) {
	x := c.x
	if !x.resets || !c.faultMu.TryLock() {
		c.refresh(le, ttl, asked)
		return
	}
	x.add("op refresh-other-ttl")
	x.add("fault reply dropped during a refresh")
	start := time.Now()
	// The request whose reply is lost: on etcd, the first is the grant
	// of the new lease, the second the move of the key onto it.
	skip := 1
	if c.rng.IntN(5) < 2 {
		skip = c.rng.IntN(3)
	}
	fired := c.arm(servers.OneShot{DropReply: true, Skip: skip, MinBytes: x.minReq, Partition: true})
	ctx, cancel := context.WithTimeout(x.t.Context(), 4*time.Second)
	x.refreshed(le, ttl, time.Now(), le.Refresh(ctx, ttl))
	cancel()
	c.healLocked(start, fired)
}

// arm arms f on every proxy of the client (faultMu held); the channel
// returned is closed when one has fired, until healLocked.
func (c *xclient) arm(f servers.OneShot) <-chan struct{} {
	fired := make(chan struct{})
	var once sync.Once
	c.disarm = make(chan struct{})
	for _, p := range c.ps {
		ch := p.FailNext(f)
		c.watchers.Go(func() {
			select {
			case <-ch:
				once.Do(func() { close(fired) })
			case <-c.disarm:
			}
		})
	}
	return fired
}

// healLocked heals the client's proxies, records the fault window from
// start, and unlocks faultMu.
func (c *xclient) healLocked(start time.Time, fired <-chan struct{}) {
	for _, p := range c.ps {
		p.Heal()
	}
	if c.disarm != nil {
		close(c.disarm)
		c.watchers.Wait()
		c.disarm = nil
	}
	if fired != nil {
		select {
		case <-fired:
			c.x.add("fault one-shot fired")
		default:
		}
	}
	c.x.mu.Lock()
	c.x.cfaults[c.name] = append(c.x.cfaults[c.name], window{start, time.Now()})
	c.x.mu.Unlock()
	c.faultMu.Unlock()
}

// release releases le in a random way: within a normal, a cancelled or a
// very short context; cut off from the servers (the Release fails), then
// healed with every connection reset (what was queued for the servers is
// lost) and released again; or with its request failed or its reply
// dropped. A second Release may follow.
func (c *xclient) release(le *check.Lease, key string, ttl time.Duration) {
	x := c.x
	ctx := context.WithoutCancel(x.t.Context())
	relCtx := func(d time.Duration) (context.Context, context.CancelFunc) {
		if d == 0 {
			c, cancel := context.WithCancel(ctx)
			cancel()
			return c, cancel
		}
		return context.WithTimeout(ctx, d)
	}
	var (
		err   error
		again = c.rng.IntN(4) == 0
	)
	r := c.rng.IntN(20)
	if long := ttl >= c.x.ttls[len(c.x.ttls)/2]; long && r < 7 {
		// A long lease is still fresh when a Release cut off from the
		// servers is followed by a second one and a new grant.
		r = 11 + r%5
	}
	if r >= 16 && !x.resets {
		r -= 5 // cut off, without the reset
	}
	if r >= 11 && (le.Err() != nil || !c.faultMu.TryLock()) {
		r = 0 // lost already (no request to fail), or the nemesis has a fault on the client's proxies
	}
	x.add("op release")
	start := time.Now()
	var variant string
	switch {
	case r >= 18:
		variant = "(reply dropped)"
	case r >= 16:
		variant = "(request failed)"
	case r >= 11:
		variant = "(cut off, then reset)"
	case r >= 9:
		variant = "(short context)"
	case r >= 7:
		variant = "(cancelled context)"
	}
	switch {
	case r < 7:
		rctx, cancel := relCtx(10 * time.Second)
		err = le.Release(rctx)
		cancel()
	case r < 9:
		rctx, cancel := relCtx(0)
		x.add("op release (cancelled context)")
		err = le.Release(rctx)
		cancel()
	case r < 11:
		rctx, cancel := relCtx(time.Duration(1+c.rng.IntN(30)) * time.Millisecond)
		x.add("op release (short context)")
		err = le.Release(rctx)
		cancel()
	case r < 16:
		if c.rng.IntN(10) < 7 {
			c.refresh(le, 0, ttl) // a fresh lease, as after a watchdog's refresh
		}
		if x.resets {
			x.add("fault release cut off, then connections reset")
		} else {
			x.add("fault release cut off")
		}
		start := time.Now()
		for _, p := range c.ps {
			p.Blackhole()
		}
		var d time.Duration
		if c.rng.IntN(2) == 0 {
			d = time.Duration(1+c.rng.IntN(50)) * time.Millisecond
		}
		rctx, cancel := relCtx(d)
		err = le.Release(rctx)
		cancel()
		// Stay cut off a while (a clean-up the Release left running in
		// the background is then waiting for an answer), and reset the
		// connections: what waited is lost.
		time.Sleep(time.Duration(600+c.rng.IntN(600)) * time.Millisecond)
		for _, p := range c.ps {
			if x.resets {
				p.Cut()
			}
		}
		c.healLocked(start, nil)
		again = c.rng.IntN(10) > 0
		if c.rng.IntN(10) < 9 {
			c.follow = &exploreFollow{c.own, ttl}
		}
	default:
		drop := r >= 18
		if drop {
			x.add("fault reply dropped during a release")
		} else {
			x.add("fault request failed during a release")
		}
		start := time.Now()
		fired := c.arm(servers.OneShot{DropReply: drop, MinBytes: x.minReq})
		rctx, cancel := relCtx(10 * time.Second)
		err = le.Release(rctx)
		cancel()
		c.healLocked(start, fired)
		again = c.rng.IntN(10) > 2
		if c.rng.IntN(2) == 0 {
			c.follow = &exploreFollow{c.own, ttl}
		}
	}
	x.trace(le.ID(), "Release %s %s..%s: %v", variant, x.at(start), x.at(time.Now()), err)
	if err == nil {
		c.auditReleased(le)
	} else if !errors.Is(err, dlock.ErrNotHeld) {
		x.releaseFailed(le)
	}
	if again {
		x.add("op release again")
		rctx, cancel := relCtx(10 * time.Second)
		err2 := le.Release(rctx)
		cancel()
		x.trace(le.ID(), "second Release: %v", err2)
		if err2 == nil {
			x.find(le.ID(), time.Now(), time.Now(), kindSecondRelOK, "lease #%d (%s, key %q): a second Release returned nil (first: %v)", le.ID(), c.name, key, err)
		}
	}
}

// auditReleased checks that a released lease's lock is gone.
func (c *xclient) auditReleased(le *check.Lease) {
	x := c.x
	ctx, cancel := context.WithTimeout(x.t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	x.add("audit")
	problem, err := x.audit.released(ctx, le)
	if err != nil {
		x.add("audit unanswered") // the servers could not say (a fault); counted so that a broken probe shows
	}
	if err != nil || problem == "" {
		return
	}
	x.find(le.ID(), start, time.Now(), kindStillThere, "lease #%d (%s, key %q, token %d) released: %s", le.ID(), c.name, le.Key(), le.Token(), problem)
}

// burst runs short lock cycles on one of the first two keys with one
// TTL, as fast as they go: the etcd lease pool hands the same lease out
// again and again.
func (c *xclient) burst() {
	x := c.x
	key := x.keys[c.rng.IntN(2)]
	ttl := c.pickTTL()
	n := 10 + c.rng.IntN(50)
	x.add("burst")
	l := c.locker()
	ctx := x.t.Context()
	for i := 0; i < n && time.Now().Before(x.end) && ctx.Err() == nil; i++ {
		sh := c.shareFor(key)
		le := c.acquire(l, key, ttl, false, c.rng.IntN(2) == 0, 2*time.Second, sh)
		if le == nil {
			continue
		}
		if sh.shared {
			c.sharedCritical(le, sh, 0)
		} else {
			x.regs[key].Update(ctx, le, 0)
		}
		x.add("op release")
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := le.Release(rctx)
		cancel()
		if err == nil && i%4 == 0 {
			c.auditReleased(le)
		}
	}
}

// closeDuring closes the client's Locker while a hold on it is under way
// (acquiring, holding or releasing), then opens a new one.
func (c *xclient) closeDuring() {
	x := c.x
	x.add("op close")
	l := c.locker()
	key, ttl := x.keys[c.rng.IntN(len(x.keys))], c.pickTTL()
	auto := ttl >= x.autoMin && c.rng.IntN(2) == 0
	hold := time.Duration(c.rng.IntN(500)) * time.Millisecond
	after := time.Duration(c.rng.IntN(400)) * time.Millisecond
	sh := c.shareFor(key)
	var (
		wg   sync.WaitGroup
		held *check.Lease // granted in the goroutine; read after wg.Wait
	)
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(x.t.Context(), 5*time.Second)
		defer cancel()
		x.add("op acquire")
		le, err := x.e.h.Acquire(ctx, c.name, l, key, sh.options(ttl, auto))
		if err != nil {
			return
		}
		held = le
		x.granted(le, ttl, auto, sh)
		if sh.shared {
			c.sharedCritical(le, sh, hold)
		} else {
			x.regs[key].Update(ctx, le, hold)
		}
		x.add("op release")
		_ = le.Release(ctx)
	})
	time.Sleep(after)
	closing := time.Now()
	_ = l.Close()
	closed := time.Now()
	wg.Wait()
	if held != nil {
		// Close releases what the Locker holds: the lease is no longer
		// valid from the moment Close is invoked, as from a Release's
		// (its Done fires only once the lock is given back).
		x.e.h.Add(check.Op{Kind: check.Release, Client: c.name, Key: key, Lease: held.ID(),
			Start: closing, End: closed, Deadline: held.Deadline(), Err: dlock.ErrClosed})
	}
	// A new Locker, as a restarted process would open.
	for time.Now().Before(x.end.Add(time.Minute)) {
		ctx, cancel := context.WithTimeout(x.t.Context(), 30*time.Second)
		nl, err := dlock.Open(ctx, x.e.deployment().url(c.addrs))
		cancel()
		if err == nil {
			c.mu.Lock()
			c.l = nl
			c.mu.Unlock()
			return
		}
		if x.t.Context().Err() != nil {
			return
		}
		time.Sleep(time.Second)
	}
}

// nemesis draws faults until the run's end: the lock of a key dropped
// (as an expiry would), a server killed and restarted or paused, a
// client's proxies blackholed (then maybe reset) or slowed, a single
// request of a client failed or its reply dropped.
func (x *explorer) nemesis() {
	rng := rand.New(rand.NewPCG(x.seed, 1000))
	ctx := x.t.Context()
	d := x.e.deployment()
	for time.Now().Before(x.end) && ctx.Err() == nil {
		time.Sleep(time.Duration(1000+rng.IntN(3000)) * time.Millisecond)
		if !time.Now().Before(x.end) {
			return
		}
		switch r := rng.IntN(10); {
		case r < 2:
		case r < 4:
			key := x.keys[rng.IntN(len(x.keys))]
			x.add("fault lock dropped")
			start := time.Now()
			ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
			dropped, toks, err := x.expire(ectx, key)
			cancel()
			end := time.Now()
			x.mu.Lock()
			x.expires = append(x.expires, keyWindow{key, window{start, end}})
			x.mu.Unlock()
			if err == nil && dropped {
				for _, tok := range toks {
					x.e.h.Expire(key, tok, start, end)
				}
			} else if err != nil {
				// It may have dropped one: assume it did.
				x.e.h.Expire(key, 0, start, end)
			}
		case r < 5 && x.nemesisServers && x.resets:
			srv := d.servers[rng.IntN(len(d.servers))]
			x.add("fault server killed and restarted")
			start := time.Now()
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			kerr := srv.Kill(sctx)
			x.mu.Lock()
			x.crashes = append(x.crashes, time.Now())
			x.mu.Unlock()
			serr := srv.Start(sctx)
			cancel()
			if kerr != nil || serr != nil {
				x.t.Errorf("nemesis: kill and restart %v: %v", srv, errors.Join(kerr, serr))
			}
			x.serverFault("server killed and restarted", start)
		case r < 6 && x.nemesisServers:
			srv := d.servers[rng.IntN(len(d.servers))]
			pause := time.Duration(300+rng.IntN(1700)) * time.Millisecond
			if !x.resets {
				// Short of the clients' reconnect, and well short of the
				// ensemble's sync limit: a member paused that long leaves
				// the quorum (or, the leader, makes the others leave it)
				// and drops its clients' connections when it runs again.
				// They would reconnect with watches set, the path of
				// go-zookeeper's lastZxid race (see resets); a 1s cap did
				// that on a busy CI machine. The draw scaled down, to
				// 60-400ms (2/5 of the sync limit).
				pause = pause * (servers.ZooKeeperSyncTimeout * 2 / 5) / (2 * time.Second)
			}
			x.add("fault server paused")
			start := time.Now()
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			perr := srv.Pause(sctx)
			paused := time.Now()
			time.Sleep(pause)
			uerr := srv.Unpause(sctx)
			cancel()
			if took := time.Since(paused); !x.resets && took > servers.ZooKeeperSyncTimeout*4/5 {
				// Say so: the member may have dropped its clients.
				x.t.Logf("nemesis: %v paused for %v (drawn %v), near the ensemble's sync limit (%v): a slow machine", srv, took.Round(time.Millisecond), pause, servers.ZooKeeperSyncTimeout)
			}
			if perr != nil || uerr != nil {
				x.t.Errorf("nemesis: pause %v: %v", srv, errors.Join(perr, uerr))
			}
			x.serverFault("server paused", start)
		default:
			c := x.clients[rng.IntN(len(x.clients))]
			kind := rng.IntN(4)
			dur := time.Duration(200+rng.IntN(2800)) * time.Millisecond
			shot := servers.OneShot{DropReply: rng.IntN(2) == 0, Skip: rng.IntN(3), MinBytes: x.minReq}
			cut := rng.IntN(2) == 0
			if !x.resets {
				// Short of the client's reconnect, nothing reset.
				dur, cut = min(dur, time.Second), false
				if kind == 3 {
					kind = 2
				}
			}
			if !c.faultMu.TryLock() {
				continue
			}
			start := time.Now()
			var fired <-chan struct{}
			switch kind {
			case 0, 1:
				x.add("fault client cut off")
				for _, p := range c.ps {
					p.Blackhole()
				}
			case 2:
				x.add("fault client link slow")
				for _, p := range c.ps {
					p.Delay(dur / 10)
				}
			default:
				x.add("fault client request failed or reply dropped")
				fired = c.arm(shot)
			}
			time.Sleep(dur)
			if kind < 2 && cut {
				for _, p := range c.ps {
					p.Cut()
				}
			}
			c.healLocked(start, fired)
		}
	}
}

// serverFault records a server fault from start until now.
func (x *explorer) serverFault(name string, start time.Time) {
	end := time.Now()
	x.e.h.Fault(name, start, end)
	x.mu.Lock()
	x.sfaults = append(x.sfaults, window{start, end})
	x.mu.Unlock()
}
