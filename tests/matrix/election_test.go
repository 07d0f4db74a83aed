package matrix_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/tests/servers"
)

// Leader election (dlock.Election) under the two faults where it differs
// from a mutex. A leader does not take the lock for a critical section and
// give it back: it holds it for as long as it lives, refreshed every third
// of its TTL, and its lead function's context must end the moment the
// term is lost. Candidates campaign, each with a Locker of its own (as
// separate processes would have); each leader writes the fenced register
// with its term (its lease's token) for as long as its term lasts. Every
// term is recorded in the history as a grant (History.Granted: invoked
// when the candidate's Run started or its previous term ended, which is
// no later than its Acquire was) and its end (Lease.GivenUp when lead
// returns; Lost when Done fires first), so the checker sees each term's
// validity: no two valid terms overlap, a later term has a larger token,
// the register refuses a write of an earlier term, and a candidate waits
// no longer than the progress bound once no term is valid.
//
// Leader paused: the first leader is a child process (electionChild, the
// test binary run again, as the mutex's paused client) running
// dlock.Election. It reads the register with its term and is stopped
// (SIGSTOP) inside its critical section, for longer than its lease (TTL
// victimTTL) can last; the candidates of the test process campaign, and
// one is elected once the servers let the lease go and writes with a
// later term. Then the child resumes: the write it had prepared must be
// refused, and its lead function's context must end (cause ErrLeaseLost)
// although nothing but its lease's Deadline passing tells it so. Then the
// leader of the test process resigns, and the other candidate is elected
// with a later term.
//
// Leader's server killed: three candidates, the first elected alone (see
// runElectionKill); right after the leader's lease was refreshed (so that the next refresh comes a third of the TTL
// later, after the restart), the server the leader talks to is killed
// with SIGKILL and started again at once: Redis's one server (no
// persistence); one Redlock node (the leader talks to all five); the etcd
// Raft leader (every member forwards the lease's keepalives and the
// writes to it); the ZooKeeper server the leader's session is connected
// to. Where the restart loses the lock on more servers than the backend
// tolerates (Redis), another candidate is elected while the leader's
// lease is valid, until its next refresh finds the lock gone: two valid
// terms overlap, the unsafety the Guarantees admit. Elsewhere the term
// must outlast the fault (the cell fails if it ended: a new term after a
// lost one shows nothing). Either way, after the recovery the leader
// resigns twice, and each time a new one is elected with a later term.
func init() {
	children[electionChildName] = electionChild
	register(&scenario{
		order:   80,
		name:    "ElectionLeaderPause",
		row:     "election: the leader paused (SIGSTOP) past its TTL; another is elected, then it resumes and writes",
		applies: all,
		expect:  expectIf(withoutTokens, violation, "without tokens the register cannot refuse the write of the leader that resumed after its term ended"),
		run:     runElectionPause,
	})
	register(&scenario{
		order:   81,
		name:    "ElectionServerKill",
		row:     "election: kill -9 and immediate restart of the leader's server (Redis: no persistence; Redlock: one node; etcd: the Raft leader; ZooKeeper: its session's server)",
		applies: all,
		expect: crashExpect(crashLostMemory,
			"the leader's lock lived only in the memory of its one server: after the restart another candidate was elected while the leader's lease was valid, until its next refresh found the lock gone"),
		run: runElectionKill,
	})
}

const (
	electionChildName = "election"
	// electionHold is a leader's work between reading the register and
	// writing it back.
	electionHold = 50 * time.Millisecond
	// electionKillTTL is the candidates' TTL in the kill cell: a refresh
	// every 3s, well after the restart (Redis restarts within half a
	// second), and within the bound of ZooKeeper's crashZKSession
	// (13.13s).
	electionKillTTL = 9 * time.Second
	// electionBound bounds the waits for the child, the servers, and an
	// election that should happen within seconds.
	electionBound = time.Minute
)

// electionCrowd is a cell's candidates in the test process.
type electionCrowd struct {
	e     *env
	cands []*electionCandidate

	mu    sync.Mutex
	terms []*electionTerm // in the order they began
}

type electionCandidate struct {
	name string
	l    *dlock.Locker
	el   *dlock.Election
}

// electionTerm is one term of a candidate of the crowd.
type electionTerm struct {
	cand    *electionCandidate
	le      *check.Lease
	granted time.Time     // when lead was called
	ended   chan struct{} // closed when lead returned (GivenUp recorded)
}

// newElectionCrowd opens the Lockers of n candidates, c1 … cn, on e.key
// with a lease of ttl. They campaign from start.
func newElectionCrowd(t *testing.T, e *env, n int, ttl time.Duration) *electionCrowd {
	t.Helper()
	c := &electionCrowd{e: e}
	for i := range n {
		name := fmt.Sprintf("c%d", i+1)
		l := e.locker()
		el, err := dlock.NewElection(l, e.key, &dlock.ElectionOptions{TTL: ttl, Holder: name})
		if err != nil {
			t.Fatalf("NewElection: %v", err)
		}
		c.cands = append(c.cands, &electionCandidate{name: name, l: l, el: el})
	}
	return c
}

// start runs the Elections of cands (default: every candidate) until
// e.stopAll. A leader writes the register with its term until its lead
// context ends.
func (c *electionCrowd) start(t *testing.T, cands ...*electionCandidate) {
	if len(cands) == 0 {
		cands = c.cands
	}
	for _, cand := range cands {
		c.e.goStop(func(stop <-chan struct{}) {
			ctx, cancel := stopContext(t.Context(), stop)
			defer cancel()
			// since: no later than the candidate's next Acquire (Run
			// campaigns after lead has returned).
			since := time.Now()
			err := cand.el.Run(ctx, func(lctx context.Context, le *dlock.Lease) error {
				tm := &electionTerm{cand: cand, le: c.e.h.Granted(cand.name, le, since), granted: time.Now(), ended: make(chan struct{})}
				c.mu.Lock()
				c.terms = append(c.terms, tm)
				c.mu.Unlock()
				defer func() {
					tm.le.GivenUp()
					since = time.Now()
					close(tm.ended)
				}()
				for lctx.Err() == nil {
					if !c.e.reg.Update(lctx, tm.le, electionHold) {
						_ = pause(lctx, electionHold) // a later term has read the register
					}
				}
				return nil
			})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s: Run returned %v, want context.Canceled", cand.name, err)
			}
		})
	}
}

// await waits up to bound for a term that matches, failing t (waiting for
// what) if none does. It returns the term that began last among those
// that match.
func (c *electionCrowd) await(t *testing.T, bound time.Duration, what string, match func(*electionTerm) bool) *electionTerm {
	t.Helper()
	var found *electionTerm
	waitFor(t, bound, what, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i := len(c.terms) - 1; i >= 0; i-- {
			if match(c.terms[i]) {
				found = c.terms[i]
				return true
			}
		}
		return false
	})
	return found
}

// leading reports whether tm's lead function is still running.
func (tm *electionTerm) leading() bool {
	select {
	case <-tm.ended:
		return false
	default:
		return true
	}
}

// handOff makes the leader (the last elected whose term goes on) resign
// n times; each time a new term must begin, with a larger term.
func (c *electionCrowd) handOff(t *testing.T, n int) {
	t.Helper()
	for range n {
		cur := c.await(t, electionBound, "a leader", (*electionTerm).leading)
		resigned := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		err := cur.cand.el.Resign(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: Resign: %v", cur.cand.name, err)
		}
		// The next leader may be elected before Resign returns (once the
		// lease is given back).
		next := c.await(t, electionBound, "a leader elected after a Resign", func(tm *electionTerm) bool {
			return tm.granted.After(cur.granted) && tm.leading()
		})
		if next.le.Token() <= cur.le.Token() {
			t.Errorf("%s was elected after %s resigned with term %d, not above %d", next.cand.name, cur.cand.name, next.le.Token(), cur.le.Token())
		}
		t.Logf("%s resigned (term %d); %s elected %v later (term %d)", cur.cand.name, cur.le.Token(), next.cand.name,
			next.granted.Sub(resigned).Round(time.Millisecond), next.le.Token())
	}
}

// runElectionPause is the paused-leader cell: see the comment on init.
func runElectionPause(t *testing.T, e *env) {
	d := e.deployment()
	c := startChild(t, e, electionChildName, d.url(d.addrs()), 0)
	// The candidates' Lockers, opened before the child is elected so that
	// its critical section is not stretched by their connecting.
	crowd := newElectionCrowd(t, e, 2, e.ttl)

	c.mu.Lock()
	c.askedAt = time.Now()
	c.mu.Unlock()
	c.send(pauseMsg{Ev: "campaign"})
	c.await("acquired", electionBound)
	acq, _, _ := c.lease()
	t.Logf("child %d leads: term %d, TTL %v", c.cmd.Process.Pid, acq.Token, acq.TTL)
	crowd.start(t)

	// The leader reads the register right after its election; it is
	// stopped inside its critical section until another candidate, elected
	// meanwhile, has written with a later term.
	taken, pausedAt, before, resumedAt := c.pauseInside(acq, electionBound, "leader", "candidate")
	t.Logf("leader paused %v (lease TTL %v, its last Deadline %v after the pause began); %s was elected with term %d and wrote the register",
		resumedAt.Sub(pausedAt).Round(time.Millisecond), acq.TTL, before.Sub(pausedAt).Round(time.Millisecond), taken.Client, taken.Token)

	// The write the leader prepared before the pause arrives now.
	w := c.await("write", electionBound)
	accepted := e.reg.Write(c.name, acq.ID, w.Token, before, w.Value)
	switch {
	case accepted && e.guarantees().Fencing != dlock.FencingNone:
		t.Errorf("the paused leader's late write with term %d was accepted after %s wrote with term %d", w.Token, taken.Client, taken.Token)
	case !accepted:
		t.Logf("the paused leader's late write with term %d was refused", w.Token)
	}
	c.send(pauseMsg{Ev: "written", OK: accepted})

	// Its lease ran out during the pause: its lead context must end now.
	const endBound = 30 * time.Second
	ended, ok := c.within("ended", endBound)
	if !ok {
		t.Fatalf("the paused leader's lead context did not end within %v of its resuming, though its lease's Deadline passed during the pause (%v before it resumed)",
			endBound, resumedAt.Sub(before).Round(time.Millisecond))
	}
	endedAt, gaveUp := time.Unix(0, ended.Start), time.Unix(0, ended.End)
	_, last, lost := c.lease()
	e.h.Add(check.Op{Kind: check.Release, Client: c.name, Key: e.key, Lease: acq.ID, Start: gaveUp, End: gaveUp, Deadline: last})
	t.Logf("the paused leader's lead context ended %v after SIGCONT: %s", endedAt.Sub(resumedAt).Round(time.Millisecond), ended.Err)
	if !ended.LeaseLost {
		t.Errorf("the paused leader's lead context ended with cause %q, want one matching ErrLeaseLost", ended.Err)
	}
	if lost == "" {
		t.Errorf("the paused leader's lease did not report Done before its term ended")
	}
	if st := c.await("stopped", electionBound); st.Err != context.Canceled.Error() {
		t.Errorf("the paused leader's Run returned %q, want %q", st.Err, context.Canceled)
	}
	select {
	case err := <-c.exited:
		c.exited <- err // for the cleanup
		if err != nil {
			t.Errorf("child: %v", err)
		}
	case <-time.After(electionBound):
		t.Errorf("child: not exited within %v of its Run's return", electionBound)
	}
	crowd.handOff(t, 1)
}

// runElectionKill is the killed-server cell: see the comment on init.
func runElectionKill(t *testing.T, e *env) {
	ctx := t.Context()
	var d *deployment
	if e.b.name == bZooKeeper {
		d = e.deploy(deployOptions{sessionTimeout: crashZKSession})
	} else {
		d = e.deployment()
	}
	unsafe := crashUnsafe(crashLostMemory(e.b), e.guarantees())
	crowd := newElectionCrowd(t, e, 3, electionKillTTL)
	if maxTTL := crowd.cands[0].l.Limits().MaxTTL; maxTTL > 0 && maxTTL < electionKillTTL {
		t.Fatalf("the backend caps a lease at %v, below the candidates' %v", maxTTL, electionKillTTL)
	}
	// The first leader campaigns alone, so that its lock is on every
	// server, as the mutex row's victim's is (checked below): a grant
	// contended on Redlock can end with the lock on a bare majority of
	// the nodes, and then a restart of one of them without the lock lets
	// another candidate in (Redlock's Notes: a restarted node must stay
	// down for a TTL), which the row's expectation, from
	// ToleratedFailures, does not count. The other candidates campaign
	// once it leads.
	crowd.start(t, crowd.cands[0])
	first := crowd.await(t, electionBound, "the first leader", func(*electionTerm) bool { return true })
	crowd.start(t, crowd.cands[1:]...)
	// Kill right after a refresh of the leader's lease (the other
	// candidates campaign meanwhile).
	dl := first.le.Deadline()
	waitFor(t, electionKillTTL, "a refresh of the leader's lease", func() bool { return first.le.Deadline().After(dl) })
	srv := electionKillTarget(t, e, d, first.cand.l)
	var raftTerm uint64
	if e.b.name == bEtcd {
		raftTerm = crashLeadership(t, e, d, srv)
	}
	redisFamily := e.b.name == bRedis || e.b.name == bRedlock
	// Redis, Redlock: the lock key (the same on both) and the leader's
	// value in it.
	lockKey := redis.DefaultPrefix + "{" + e.key + "}"
	var owner string
	if redisFamily {
		if owner = crashRedisGet(t, srv.Addr(), lockKey); owner == "" {
			t.Fatalf("%v does not hold the leader's lock before the kill: killing it shows nothing", srv)
		}
		holding := 0
		for _, s := range d.servers {
			if crashRedisGet(t, s.Addr(), lockKey) == owner {
				holding++
			}
		}
		// Redlock: the expectation counts one node lost of those that
		// hold the lock, which a majority must still hold.
		if quorum := len(d.servers)/2 + 1; e.b.name == bRedlock && holding-1 < quorum {
			t.Fatalf("the leader's lock is on %d of %d nodes before the kill: without the one killed, no majority holds it", holding, len(d.servers))
		}
	}
	t.Logf("%s leads (term %d); kill -9 %v", first.cand.name, first.le.Token(), srv)
	killed := time.Now()
	if err := srv.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatalf("restarting %v: %v", srv, err)
	}
	restarted := time.Now()
	for _, cand := range crowd.cands {
		crashAwaitReachable(t, cand.l)
	}
	recovered := time.Now()
	e.h.Fault("kill -9 and restart of "+srv.String(), killed, recovered.Add(2*time.Second))
	t.Logf("%v restarted %v after the kill; every candidate reached the servers again %v after it",
		srv, restarted.Sub(killed).Round(time.Millisecond), recovered.Sub(killed).Round(time.Millisecond))
	if e.b.name == bZooKeeper {
		crashAwaitServing(t, e, d, srv)
	} else {
		crashCheckLeadership(t, e, d, []*servers.Server{srv}, raftTerm)
	}
	// A candidate may have taken a lost lock by now: compare values.
	if redisFamily && crashRedisGet(t, srv.Addr(), lockKey) == owner {
		t.Fatalf("the leader's lock survived a restart without persistence on %v: nothing was lost, the cell shows nothing", srv)
	}

	if unsafe {
		// Another candidate is elected on the restarted server while the
		// leader's lease is valid (maybe before Start returned: a term
		// that began after the kill began after the restart).
		next := crowd.await(t, crashBound, "another candidate elected after the restart", func(tm *electionTerm) bool {
			return tm != first && tm.granted.After(killed)
		})
		if first.le.Err() != nil {
			t.Fatalf("the leader's lease had ended (%v) when %s was elected: no overlap shown", first.le.Err(), next.cand.name)
		}
		t.Logf("%s elected (term %d) %v after the kill while %s's lease was valid for %v more", next.cand.name, next.le.Token(),
			next.granted.Sub(killed).Round(time.Millisecond), first.cand.name, first.le.Deadline().Sub(next.granted).Round(time.Millisecond))
		// Both lead until the old leader's next refresh finds the lock
		// gone: its lead context must end then.
		waitFor(t, electionKillTTL, "the old leader's term to end after its next refresh", func() bool { return !first.leading() })
		t.Logf("%s's term ended %v after %s's began: %v", first.cand.name, time.Since(next.granted).Round(time.Millisecond), next.cand.name, first.le.Err())
	} else {
		// The term goes on for a second after the recovery.
		time.Sleep(time.Second)
		if !first.leading() || first.le.Err() != nil {
			t.Fatalf("the leader's term ended during the fault (lease: %v): the cell must show the term outlasting the fault", first.le.Err())
		}
		t.Logf("%s's term outlasted the fault", first.cand.name)
	}
	crowd.handOff(t, 2)
	crashOnlyOverlap(t, e)
}

// electionKillTarget returns the server the leader (on Locker l) talks to
// whose crash matters most: the one Redis, Redlock's first node, the etcd
// Raft leader, the ZooKeeper server l's session is connected to.
func electionKillTarget(t *testing.T, e *env, d *deployment, l *dlock.Locker) *servers.Server {
	t.Helper()
	if e.b.name != bZooKeeper {
		return crashLeader(t, e, d)[0]
	}
	var zc *zk.Conn
	if !driver.LockerAs(l, &zc) {
		t.Fatal("the leader's Locker has no ZooKeeper client")
	}
	_, port, err := net.SplitHostPort(zc.Server())
	if err != nil {
		t.Fatalf("the leader's ZooKeeper server %q: %v", zc.Server(), err)
	}
	for _, s := range d.servers {
		if _, p, _ := net.SplitHostPort(s.Addr()); p == port {
			return s
		}
	}
	t.Fatalf("the leader's session is on %s, none of the ensemble's servers", zc.Server())
	return nil
}

// within is await that reports, rather than fails on, a message that does
// not come within d.
func (c *pausedClient) within(ev string, d time.Duration) (pauseMsg, bool) {
	c.t.Helper()
	select {
	case m := <-c.msgs:
		if m.Ev != ev {
			c.t.Fatalf("child: waiting for %q, got %+v", ev, m)
		}
		return m, true
	case err := <-c.exited:
		c.exited <- err // for the cleanup
		c.t.Fatalf("child: exited (%v) while the test waited for %q", err, ev)
	case <-time.After(d):
	}
	return pauseMsg{}, false
}

// electionChild is the leader that is paused (the child process's main):
// it campaigns with dlock.Election when the parent says so, and in its one
// term goes through a critical section with the parent, which holds the
// register (see pauseMsg), then waits for its lead context to end.
func electionChild() int {
	cio := newChildIO()
	l, key, ttl, err := childLocker()
	if err != nil {
		return cio.fail("%v", err)
	}
	defer l.Close()
	el, err := dlock.NewElection(l, key, &dlock.ElectionOptions{TTL: ttl, Holder: "paused"})
	if err != nil {
		return cio.fail("NewElection: %v", err)
	}
	cio.send(pauseMsg{Ev: "ready"})
	if _, err := cio.next("campaign"); err != nil {
		return cio.fail("%v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var failed error
	err = el.Run(ctx, func(lctx context.Context, le *dlock.Lease) error {
		defer cancel() // one term: Run returns once it has given the lease back
		cio.send(pauseMsg{Ev: "acquired", Token: le.Token(), TTL: le.TTL(), Deadline: le.Deadline().UnixNano()})
		ended := make(chan time.Time, 1) // when lctx ended
		context.AfterFunc(lctx, func() { ended <- time.Now() })
		stopReports := reportLease(le, cio.send)
		defer stopReports()

		// The critical section: read, work, write. The parent stops this
		// process right after answering the read.
		cio.send(pauseMsg{Ev: "read", Token: le.Token()})
		v, err := cio.next("value")
		if err != nil {
			failed = err
			return err
		}
		if !v.OK {
			failed = fmt.Errorf("the register refused the read with term %d", le.Token())
			return failed
		}
		time.Sleep(100 * time.Millisecond) // the work between read and write
		cio.send(pauseMsg{Ev: "write", Token: le.Token(), Value: v.Value})
		if _, err := cio.next("written"); err != nil {
			failed = err
			return err
		}

		// Lead until the term ends.
		endedAt := <-ended
		cause := context.Cause(lctx)
		if errors.Is(cause, dlock.ErrLeaseLost) {
			// Done has fired or is about to: wait until reportLease has
			// sent "lost", so that the parent has it before "ended".
			<-le.Done()
			stopReports()
		}
		cio.send(pauseMsg{Ev: "ended", Start: endedAt.UnixNano(), End: time.Now().UnixNano(), Err: pauseErrText(cause),
			LeaseLost: errors.Is(cause, dlock.ErrLeaseLost)})
		return nil
	})
	if failed != nil {
		return cio.fail("%v", failed)
	}
	cio.send(pauseMsg{Ev: "stopped", Err: pauseErrText(err)})
	return 0
}

// reportLease sends "deadline" each time le's Deadline moves and "lost"
// when its Done fires, until the function it returns is called; that
// function returns once the reports have stopped, and Done, if it had
// fired by then, has been reported.
func reportLease(le *dlock.Lease, send func(pauseMsg)) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		last := le.Deadline()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-le.Done():
				send(pauseMsg{Ev: "lost", Err: fmt.Sprint(le.Err())})
				return
			case <-quit:
				return
			case <-tick.C:
				if d := le.Deadline(); !d.Equal(last) {
					last = d
					send(pauseMsg{Ev: "deadline", Deadline: d.UnixNano()})
				}
			}
		}
	}()
	return func() {
		select {
		case <-le.Done():
			<-done
		default:
			close(quit)
			<-done
		}
	}
}
