package matrix_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/tests/servers"
)

// Shared leases (issue 24): a counting semaphore (AcquireOptions.Permits)
// and a read-write lock (AcquireOptions.Shared for a reader, a plain
// acquire for the writer), under the faults where they differ from a
// mutex. Only the backends whose Guarantees say Shared run these rows:
// Redis, etcd and ZooKeeper. Redlock refuses shared leases with
// dlock.ErrUnsupported, so its cells show —.
//
// A semaphore's holders are concurrent: no fenced register judges them
// (env.critical), the checker's permit count does: at no moment are more
// than its permits of its leases valid. The read-write lock's writers
// update the fenced register, and its readers read it with their tokens,
// so that a writer that goes on after its lease is refused once a later
// writer or reader has been seen.
//
// Permit holder paused: a semaphore of sharedPermits. The paused client
// (pauseChild, with pausePermitsEnv) takes a permit with AutoRefresh and is
// stopped (SIGSTOP) while it holds it, for longer than its lease (TTL
// victimTTL) can last, while three contenders with Lockers of their own
// take permits over and over. It stays stopped until its lease's last
// Deadline has passed and two contenders have held permits at once after
// it: the servers freed its permit, and the others took it. Then it
// resumes: its lease must end (Done, with an error that matches
// ErrLeaseLost) though it was not told, and its Release, probed around by
// another permit's TryAcquire (a stale release that freed someone else's
// permit shows as one permit too many), must say ErrNotHeld or
// ErrLeaseLost.
//
// Writer paused: the mutex's paused-client row (runClientPause) on a
// read-write lock, with two writers and two readers as the contenders: the
// paused writer's late write must be refused by the register.
//
// Server killed: sharedPermits victims, each with a Locker of its own,
// hold the key with unrefreshed leases of crashTTL (all the permits of a
// semaphore of sharedPermits; or two readers of a read-write lock), while
// contenders wait (three more permits; or two writers and a reader). The
// server that matters most (the one Redis, the etcd or ZooKeeper leader) is
// killed with SIGKILL and started again at once, as in the mutex's
// KillRestart row. A restarted Redis without persistence has lost every
// lease on the key: the contenders are granted while the victims' leases
// are valid, the unsafety its Guarantees admit (ToleratedFailures 0):
// more permits than the semaphore has, or a writer with readers. etcd and
// ZooKeeper keep their leases on disk: the victims still hold (Inspect
// lists them after the restart), release cleanly, and a contender that
// waited is granted only then.
func init() {
	register(&scenario{
		order:   90,
		name:    "SemaphorePause",
		row:     fmt.Sprintf("semaphore (%d permits): a permit holder paused (SIGSTOP) past its TTL; the others take its permit, then it resumes and releases (Redlock: no shared leases)", sharedPermits),
		applies: sharedBackends,
		// A pause frees no permit before the holder's Deadline: the
		// server keeps the lease at least that long on every backend.
		expect: func(*backend, dlock.Guarantees) expectation { return expectation{outcome: safe} },
		run:    runSemaphorePause,
	})
	register(&scenario{
		order:   91,
		name:    "RWWriterPause",
		row:     "read-write lock: the writer paused (SIGSTOP) past its TTL while readers and writers contend, then it writes and releases (Redlock: no shared leases)",
		applies: sharedBackends,
		expect:  expectIf(withoutTokens, violation, "without tokens the register cannot refuse the write the paused writer makes after its lease ran out"),
		run: func(t *testing.T, e *env) {
			w, r := &dlock.AcquireOptions{TTL: e.ttl}, &dlock.AcquireOptions{TTL: e.ttl, Shared: true}
			stops := runClientPause(t, e, []contender{{"w0", w}, {"r0", r}, {"w1", w}, {"r1", r}})
			// Redis has no queue, and a waiting writer's reservation
			// refuses readers (redis/doc.go): two writers that take
			// turns can keep the readers out for the whole cell (seen
			// once in CI). Stop the writers, so that a reader is
			// served in every run.
			stops[0]()
			stops[2]()
			sharedReadersServed(t, e, "r0", "r1")
		},
	})
	register(&scenario{
		order:   92,
		name:    "SemaphoreServerKill",
		row:     fmt.Sprintf("semaphore (%d permits): kill -9 and immediate restart while its permits are held (Redis: no persistence; etcd, ZooKeeper: the leader; Redlock: no shared leases)", sharedPermits),
		applies: sharedBackends,
		expect: crashExpect(crashLostMemory,
			"the permits lived only in the memory of its one server: after the restart other clients took them while their holders' leases were valid, more holders than permits"),
		run: func(t *testing.T, e *env) { runSharedKill(t, e, true) },
	})
	register(&scenario{
		order:   93,
		name:    "RWServerKill",
		row:     "read-write lock: kill -9 and immediate restart while readers hold it and writers wait (Redis: no persistence; etcd, ZooKeeper: the leader; Redlock: no shared leases)",
		applies: sharedBackends,
		expect: crashExpect(crashLostMemory,
			"the readers' leases lived only in the memory of its one server: after the restart a writer was granted while they were valid"),
		run: func(t *testing.T, e *env) { runSharedKill(t, e, false) },
	})
}

// sharedPermits is the size of the rows' semaphore, and the number of
// readers that hold the read-write lock in the kill row.
const sharedPermits = 2

// sharedBackends are the backends that serve shared leases (their
// Guarantees say Shared); Redlock refuses them (dlock.ErrUnsupported).
var sharedBackends = only(bRedis, bEtcd, bZooKeeper)

// runSemaphorePause is the paused permit holder's cell: see the comment on
// init.
func runSemaphorePause(t *testing.T, e *env) {
	const (
		hold  = 250 * time.Millisecond // a contender's critical section
		bound = time.Minute            // for every wait on the servers or the child
	)
	o := &dlock.AcquireOptions{TTL: e.ttl, Permits: sharedPermits}
	d := e.deployment()
	c := startPausedClient(t, e, d.url(d.addrs()), sharedPermits)
	cs := contenders(3, "c", o)
	// The contenders' Lockers, opened before the child takes its permit
	// so that its hold is not stretched by their connecting.
	var ls []*dlock.Locker
	for range cs {
		ls = append(ls, e.locker())
	}
	prober := e.locker()

	c.mu.Lock()
	c.askedAt = time.Now()
	c.mu.Unlock()
	c.send(pauseMsg{Ev: "acquire"})
	c.await("acquired", bound)
	acq, _, _ := c.lease()
	t.Logf("child %d holds a permit of %d: token %d, TTL %v", c.cmd.Process.Pid, sharedPermits, acq.Token, acq.TTL)
	if !acq.Shared || acq.Permits != sharedPermits {
		t.Fatalf("the child's grant is recorded with Shared %v, Permits %d: want a permit of %d", acq.Shared, acq.Permits, sharedPermits)
	}
	ctx := t.Context()
	e.startCycling(ctx, cs, ls, bound, hold)

	// Stopped while it holds its permit, until its lease is over and two
	// contenders have held permits at once after that.
	c.await("holding", bound)
	c.signal(syscall.SIGSTOP)
	pausedAt := time.Now()
	var both [2]check.Span
	for end := time.Now().Add(bound); ; time.Sleep(20 * time.Millisecond) {
		_, deadline, _ := c.lease()
		var ok bool
		if time.Now().After(deadline) {
			both, ok = sharedTwoAtOnce(e.h, c.name, deadline)
		}
		if ok {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("two contenders did not hold permits at once within %v of pausing the permit holder (its lease's last Deadline %v after the pause began)",
				bound, deadline.Sub(pausedAt).Round(time.Millisecond))
		}
	}
	_, before, _ := c.lease()
	resumedAt := time.Now()
	c.signal(syscall.SIGCONT)
	t.Logf("paused %v (lease TTL %v, its last Deadline %v after the pause began); leases #%d and #%d of contenders, granted %v and %v after that Deadline, were valid together",
		resumedAt.Sub(pausedAt).Round(time.Millisecond), acq.TTL, before.Sub(pausedAt).Round(time.Millisecond), both[0].Lease, both[1].Lease,
		both[0].Start.Sub(before).Round(time.Millisecond), both[1].Start.Sub(before).Round(time.Millisecond))

	// Its lease ended during the pause: Done must fire now, though nothing
	// but its Deadline passing tells the child so.
	const endBound = 30 * time.Second
	waitFor(t, endBound, "the paused permit holder's Done after it resumed", func() bool {
		_, _, lost := c.lease()
		return lost != ""
	})
	c.mu.Lock()
	lost, lostLeaseLost := c.lost, c.lostLeaseLost
	c.mu.Unlock()
	t.Logf("the paused permit holder's Done fired %v after SIGCONT: %s", time.Since(resumedAt).Round(time.Millisecond), lost)
	if !lostLeaseLost {
		t.Errorf("the paused permit holder's lease ended with %q, want an error matching ErrLeaseLost", lost)
	}

	// Its Release, while the contenders hold their permits: probe the key
	// all through it (see env.probe), as a permit of the same semaphore.
	since := time.Now()
	if _, ok := pauseAwait(e.h, bound, func(op check.Op) bool {
		return op.Granted() && op.Client != c.name && op.End.After(since)
	}); !ok {
		t.Fatalf("no contender was granted a permit within %v after the paused holder resumed", bound)
	}
	stopProbe := e.probeWith(ctx, prober, o)
	c.send(pauseMsg{Ev: "resume"})
	rel := c.await("released", bound)
	time.Sleep(2 * hold) // the prober goes on for a holder's critical section after the release
	t.Logf("%d probes of the semaphore around the stale release", stopProbe())
	relErr := errors.New(rel.Err)
	switch {
	case rel.NotHeld:
		relErr = fmt.Errorf("%w: %s", dlock.ErrNotHeld, rel.Err)
	case rel.LeaseLost:
		relErr = fmt.Errorf("%w: %s", dlock.ErrLeaseLost, rel.Err)
	case rel.Err == "":
		relErr = nil
	}
	e.h.Add(check.Op{Kind: check.Release, Client: c.name, Key: e.key, Lease: acq.ID, Start: time.Unix(0, rel.Start), End: time.Unix(0, rel.End),
		Deadline: before, Err: relErr})
	if !rel.NotHeld && !rel.LeaseLost {
		t.Errorf("the paused permit holder's Release after its lease ran out = %q, want ErrNotHeld or ErrLeaseLost", rel.Err)
	}
	select {
	case err := <-c.exited:
		c.exited <- err // for the cleanup
		if err != nil {
			t.Errorf("child: %v", err)
		}
	case <-time.After(bound):
		t.Errorf("child: not exited within %v of its Release", bound)
	}
	// A few more grants after the stale release, for the checker.
	since = time.Now()
	for range cs {
		op, ok := pauseAwait(e.h, bound, func(op check.Op) bool { return op.Granted() && op.End.After(since) })
		if !ok {
			t.Fatalf("no contender was granted a permit within %v after the paused holder's release", bound)
		}
		since = op.End
	}
}

// sharedTwoAtOnce looks in h for two leases of clients other than paused,
// granted after from and both released, that were valid at the same time
// (as check.Validity judges them; a lease still held is not counted: its
// validity may yet be cut by a release in flight).
func sharedTwoAtOnce(h *check.History, paused string, from time.Time) ([2]check.Span, bool) {
	ops := h.Ops()
	released := map[int]bool{}
	client := map[int]string{}
	for _, op := range ops {
		switch {
		case op.Kind == check.Release:
			released[op.Lease] = true
		case op.Granted():
			client[op.ID] = op.Client
		}
	}
	var spans []check.Span
	for _, sp := range check.Validity(h) {
		if released[sp.Lease] && client[sp.Lease] != paused && sp.Valid() && sp.Start.After(from) {
			spans = append(spans, sp)
		}
	}
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			if a.Start.Before(b.End) && b.Start.Before(a.End) {
				return [2]check.Span{a, b}, true
			}
		}
	}
	return [2]check.Span{}, false
}

// sharedReadersServed fails t unless a reader among readers is granted a
// lease within a minute: the read-write row must have had readers beside
// the writers.
func sharedReadersServed(t *testing.T, e *env, readers ...string) {
	t.Helper()
	reader := func(op check.Op) bool { return op.Granted() && op.Shared && slices.Contains(readers, op.Client) }
	if _, ok := pauseAwait(e.h, time.Minute, reader); !ok {
		t.Errorf("no reader (%v) was granted the read-write lock: the cell exercised writers only", readers)
	}
	n := 0
	for _, op := range e.h.Ops() {
		if reader(op) {
			n++
		}
	}
	t.Logf("%d readers' leases granted", n)
}

// runSharedKill is the killed-server cell, on a semaphore (sem) or a
// read-write lock: see the comment on init.
func runSharedKill(t *testing.T, e *env, sem bool) {
	ctx := t.Context()
	var d *deployment
	if e.b.name == bZooKeeper {
		d = e.deploy(deployOptions{sessionTimeout: crashZKSession}) // room for crashTTL, see crashZKSession
	} else {
		d = e.deployment()
	}
	unsafe := crashUnsafe(crashLostMemory(e.b), e.guarantees())
	what, allowed := "permits", check.PermitCount
	vo := &dlock.AcquireOptions{TTL: crashTTL, Permits: sharedPermits}
	cs := contenders(3, "c", &dlock.AcquireOptions{TTL: e.ttl, Permits: sharedPermits})
	// blocked: a contender the victims keep out (a writer of the
	// read-write lock; every contender of the full semaphore).
	blocked := func(op check.Op) bool {
		return slices.ContainsFunc(cs, func(c contender) bool { return c.name == op.Client })
	}
	if !sem {
		what, allowed = "readers", check.MutualExclusion
		vo = &dlock.AcquireOptions{TTL: crashTTL, Shared: true}
		w, r := &dlock.AcquireOptions{TTL: e.ttl}, &dlock.AcquireOptions{TTL: e.ttl, Shared: true}
		cs = []contender{{"w1", w}, {"w2", w}, {"r1", r}}
		blocked = func(op check.Op) bool { return op.Client == "w1" || op.Client == "w2" }
	}

	// The victims take the key (every permit; two readers), each on a
	// Locker of its own, and hold it across the fault without a refresh.
	var (
		victims []*check.Lease
		lockers []*dlock.Locker
	)
	for i := range sharedPermits {
		l := e.locker()
		if maxTTL := l.Limits().MaxTTL; maxTTL > 0 && maxTTL < crashTTL {
			t.Fatalf("the backend caps a lease at %v, below the victims' %v: a lease cannot outlast the fault without a refresh", maxTTL, crashTTL)
		}
		actx, cancel := context.WithTimeout(ctx, crashBound)
		v, err := e.h.TryAcquire(actx, fmt.Sprintf("victim%d", i+1), l, e.key, vo)
		cancel()
		if err != nil {
			t.Fatalf("victim %d's acquire: %v", i+1, err)
		}
		if !sem {
			if _, ok := e.reg.Read(v.Token()); !ok {
				t.Fatalf("the register refused reader %d's token %d", i+1, v.Token())
			}
		}
		victims = append(victims, v)
		lockers = append(lockers, l)
	}
	deadline := func() time.Time { // the first of the victims' Deadlines
		return slices.MinFunc(victims, func(a, b *check.Lease) int { return a.Deadline().Compare(b.Deadline()) }).Deadline()
	}
	t.Logf("%d victims hold the key (%s), tokens %d and %d, TTL %v, valid for %v", len(victims), what, victims[0].Token(), victims[1].Token(),
		crashTTL, time.Until(deadline()).Round(time.Millisecond))

	crowd := crashStartCrowdOf(t, e, cs, e.locker)
	lockers = append(lockers, crowd.lockers...)
	crowd.awaitAllWaiting(t)
	admin := e.locker()
	lockers = append(lockers, admin)
	if missing := sharedMissing(t, admin, e.key, victims); len(missing) > 0 {
		t.Fatalf("Inspect does not list the victims' tokens %v before the kill: killing the server shows nothing", missing)
	}

	srv := crashLeader(t, e, d)[0]
	term := crashLeadership(t, e, d, srv)
	t.Logf("kill -9 %v", srv)
	killed := time.Now()
	if err := srv.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatalf("restarting %v: %v", srv, err)
	}
	restarted := time.Now()
	for _, l := range lockers {
		crashAwaitReachable(t, l)
	}
	recovered := time.Now()
	e.h.Fault("kill -9 and restart of "+srv.String(), killed, recovered.Add(2*time.Second))
	t.Logf("%v restarted %v after the kill; every client reached the servers again %v after it",
		srv, restarted.Sub(killed).Round(time.Millisecond), recovered.Sub(killed).Round(time.Millisecond))
	crashCheckLeadership(t, e, d, []*servers.Server{srv}, term)

	// What the restart did to the victims' leases (tokens compared: a
	// contender may hold the key by now).
	missing := sharedMissing(t, admin, e.key, victims)
	switch {
	case unsafe && len(missing) < len(victims):
		t.Fatalf("the victims' leases survived a restart without persistence on %v (missing only %v): nothing was lost, the cell shows nothing", srv, missing)
	case unsafe:
		t.Logf("the restart lost the victims' leases on %v", srv)
	case len(missing) > 0:
		t.Fatalf("Inspect does not list the victims' tokens %v after the restart: their leases did not survive the fault", missing)
	default:
		t.Logf("Inspect lists the victims after the restart")
	}

	if unsafe {
		// A contender the victims kept out is granted while their leases
		// are valid.
		e.awaitOps(t, crashBound, "a blocked contender's grant after the restart", func(ops []check.Op) bool {
			return crashHas(ops, func(op check.Op) bool { return op.Granted() && blocked(op) && op.End.After(restarted) })
		})
		if !time.Now().Before(deadline()) {
			t.Fatalf("a victim's lease ran out (Deadline %v) before a blocked contender's grant was seen: no overlap shown", deadline())
		}
	} else {
		// The victims hold on for a second after the recovery, while the
		// contenders try the servers again.
		time.Sleep(time.Second)
		for _, v := range victims {
			if v.Err() != nil {
				t.Fatalf("%s's lease ended during the fault (%v; Deadline %v after the kill): the cell must show the leases surviving the fault",
					v.Client(), v.Err(), v.Deadline().Sub(killed).Round(time.Millisecond))
			}
		}
	}

	released := time.Now()
	left := deadline().Sub(released)
	for _, v := range victims {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := v.Release(rctx)
		cancel()
		switch {
		case !unsafe && err != nil:
			t.Errorf("%s's Release (its lease valid across the restart): %v", v.Client(), err)
		case err != nil:
			t.Logf("%s's Release: %v", v.Client(), err)
		}
	}
	if !unsafe {
		e.awaitOps(t, crashBound, "grant, after the victims' release, of a contender that waited for it", func(ops []check.Op) bool {
			return crashHas(ops, func(op check.Op) bool {
				return op.Granted() && blocked(op) && op.Start.Before(released) && op.End.After(released)
			})
		})
		t.Logf("the victims held the key across the restart (released %v after the kill, their leases valid for %v more); "+
			"a contender that waited was granted after their release", released.Sub(killed).Round(time.Millisecond), left.Round(time.Millisecond))
	}
	e.awaitOps(t, crashHandoffsBound, fmt.Sprintf("%d contender grants after the victims' release", crashHandoffs), func(ops []check.Op) bool {
		return crashCount(ops, func(op check.Op) bool { return op.Granted() && crowd.names[op.Client] && op.End.After(released) }) >= crashHandoffs
	})
	t.Logf("%d contender grants %v after the victims' release", crashHandoffs, time.Since(released).Round(time.Millisecond))
	crashOnly(t, e, allowed)
}

// sharedMissing returns the tokens of leases that Inspect (through l) does
// not list among the key's holders.
func sharedMissing(t *testing.T, l *dlock.Locker, key string, leases []*check.Lease) []dlock.Token {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	info, err := l.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	var missing []dlock.Token
	held := map[dlock.Token]bool{}
	for _, h := range info.Holders {
		held[h.Token] = true
	}
	for _, le := range leases {
		if !held[le.Token()] {
			missing = append(missing, le.Token())
		}
	}
	return missing
}
