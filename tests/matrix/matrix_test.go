package matrix_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/tests/servers"
)

// childEnv, when set to a name in children, makes the test binary that
// child process (a client the matrix can SIGSTOP) instead of running tests.
const childEnv = "DLOCK_MATRIX_CHILD"

// children are the child processes a scenario can start (see childEnv).
var children = map[string]func() int{}

func TestMain(m *testing.M) {
	if name := os.Getenv(childEnv); name != "" {
		run, ok := children[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "%s=%q: no such child\n", childEnv, name)
			os.Exit(2)
		}
		os.Exit(run())
	}
	servers.Main(m)
}

// outcome is what a cell shows.
type outcome string

const (
	safe        outcome = "safe"
	violation   outcome = "violation"
	unavailable outcome = "unavailable"
	notRun      outcome = "" // the scenario does not apply to the backend
)

// expectation is a cell's expected outcome and, for a violation or an
// unavailability, why the backend's Guarantees admit it (one sentence,
// printed under the README table).
type expectation struct {
	outcome outcome
	why     string
}

// scenario is one row of the matrix: a fault and the workload around it.
type scenario struct {
	order int    // row position
	name  string // subtest name
	row   string // the README row label
	// applies reports whether the scenario runs on backend b.
	applies func(b *backend) bool
	// expect derives the expected outcome from the backend's Guarantees
	// (g) and the fault; b only says which deployment it runs on.
	expect func(b *backend, g dlock.Guarantees) expectation
	// run runs the workload and the fault, recording into e.h. It may mark
	// e.unavailable. The history is checked when it returns.
	run func(t *testing.T, e *env)
}

var (
	scenariosMu sync.Mutex
	scenarios   []*scenario
)

// register adds a scenario (from an init function of its file).
func register(s *scenario) {
	scenariosMu.Lock()
	defer scenariosMu.Unlock()
	scenarios = append(scenarios, s)
	slices.SortFunc(scenarios, func(a, b *scenario) int { return a.order - b.order })
}

// expectIf expects o, for the reason why, from a backend whose Guarantees
// admit it (unsafe reports that), and safe from any other.
func expectIf(unsafe func(dlock.Guarantees) bool, o outcome, why string) func(*backend, dlock.Guarantees) expectation {
	return func(_ *backend, g dlock.Guarantees) expectation {
		if unsafe(g) {
			return expectation{o, why}
		}
		return expectation{outcome: safe}
	}
}

// The Guarantees that admit an outcome other than safe.
var (
	// withoutTokens: no fencing tokens, so a resource cannot refuse a
	// holder that goes on after its lease ended.
	withoutTokens = func(g dlock.Guarantees) bool { return g.Fencing == dlock.FencingNone }
	// clockDependent: exclusion rests on clocks, pauses and delays.
	clockDependent = func(g dlock.Guarantees) bool { return g.ClockDependent }
	// noFailover: no server may fail, so a failover may lose the lock.
	noFailover = func(g dlock.Guarantees) bool { return g.ToleratedFailures == 0 }
)

// all applies to every backend.
func all(*backend) bool { return true }

// only applies to the backends named.
func only(names ...string) func(*backend) bool {
	return func(b *backend) bool { return slices.Contains(names, b.name) }
}

// cell is one observed (backend, scenario) result.
type cell struct {
	got, want expectation
	detail    string // the violations or the unavailability seen
}

// TestMatrix runs every scenario on every backend it applies to, backends
// in parallel and a backend's scenarios one after another, each on fresh
// servers; then compares the observed matrix with the README.
func TestMatrix(t *testing.T) {
	if os.Getenv("DLOCK_TEST_NETWORK") != "host" {
		msg := "the fault matrix needs host networking (DLOCK_TEST_NETWORK=host): restarted servers must keep their ports and Sentinel announces host addresses"
		if os.Getenv("DLOCK_REQUIRE_SERVERS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// Goroutines of the Docker client (its HTTP connections, reused
	// across cells) are not the lock's; everything else must be gone
	// once the cells and their cleanups have run.
	leaks := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait")}
	var (
		mu    sync.Mutex
		cells = map[string]map[string]cell{} // scenario name → backend name → cell
	)
	t.Run("cells", func(t *testing.T) {
		for _, b := range backends {
			t.Run(b.name, func(t *testing.T) {
				t.Parallel()
				for _, s := range scenarios {
					if !s.applies(b) {
						continue
					}
					t.Run(s.name, func(t *testing.T) {
						c := runCell(t, b, s)
						mu.Lock()
						if cells[s.name] == nil {
							cells[s.name] = map[string]cell{}
						}
						cells[s.name][b.name] = c
						mu.Unlock()
					})
				}
			})
		}
	})
	if err := goleak.Find(leaks...); err != nil {
		t.Errorf("goroutines left after the cells: %v", err)
	}
	if t.Failed() || t.Skipped() {
		return
	}
	if n := countCells(); len(cellsFlat(cells)) != n {
		msg := fmt.Sprintf("%d of %d cells ran: the README is not compared", len(cellsFlat(cells)), n)
		if f := flag.Lookup("test.run"); f == nil || !strings.Contains(f.Value.String(), "/") {
			t.Error(msg + ", though no -run filter chose cells") // a cell skipped
			return
		}
		t.Log(msg + " (a -run filter chose cells)")
		return
	}
	compareREADME(t, renderTable(cells))
}

func countCells() int {
	n := 0
	for _, s := range scenarios {
		for _, b := range backends {
			if s.applies(b) {
				n++
			}
		}
	}
	return n
}

func cellsFlat(cells map[string]map[string]cell) []cell {
	var out []cell
	for _, bs := range cells {
		for _, c := range bs {
			out = append(out, c)
		}
	}
	return out
}

// runCell runs scenario s on backend b and checks the outcome against the
// expectation.
func runCell(t *testing.T, b *backend, s *scenario) cell {
	e := newEnv(t, b)
	defer e.stopAll() // also when the scenario fails
	s.run(t, e)
	if t.Failed() {
		t.FailNow()
	}
	e.stopAll()
	vs := check.Check(e.h, check.Options{Progress: e.progress})
	var safety, live []check.Violation
	for _, v := range vs {
		if v.Property.Safety() {
			safety = append(safety, v)
		} else {
			live = append(live, v)
		}
	}
	want := s.expect(b, e.guarantees())
	c := cell{want: want}
	switch {
	case len(safety) > 0:
		c.got = expectation{outcome: violation, why: properties(safety)}
		c.detail = check.Summary(firstN(safety, 5))
	case e.unavailable != "":
		c.got = expectation{outcome: unavailable}
		c.detail = e.unavailable
	default:
		c.got = expectation{outcome: safe}
	}
	grants, writes := e.counts()
	t.Logf("observed %s (%d grants, %d register writes accepted); expected %s", c.got.outcome, grants, writes, want.outcome)
	if c.detail != "" {
		t.Logf("%s", c.detail)
	}
	if len(live) > 0 {
		t.Errorf("liveness: a lock that is up must make progress:\n%s", check.Summary(firstN(live, 5)))
	}
	if c.got.outcome != want.outcome {
		switch {
		case want.outcome == violation:
			t.Errorf("expected the documented unsafety (%s) to show, observed %s: the scenario is too weak", want.why, c.got.outcome)
		default:
			t.Errorf("expected %s, observed %s: %s", want.outcome, c.got.outcome, c.got.why)
		}
	}
	if grants == 0 {
		t.Errorf("no lease was granted: the scenario exercised nothing")
	}
	return c
}

func firstN(vs []check.Violation, n int) []check.Violation { return vs[:min(n, len(vs))] }

// properties lists the distinct properties of vs, in a fixed order.
func properties(vs []check.Violation) string {
	var ps []string
	for _, p := range []check.Property{check.MutualExclusion, check.PermitCount, check.TokenOrder, check.LostUpdate, check.StaleWrite} {
		if slices.ContainsFunc(vs, func(v check.Violation) bool { return v.Property == p }) {
			ps = append(ps, string(p))
		}
	}
	return strings.Join(ps, ", ")
}

// env is one cell's run: its servers (started on first use), its history,
// and the fenced register its clients write.
type env struct {
	t   *testing.T
	b   *backend
	h   *check.History
	reg *check.Register
	key string
	// ttl is the lease time the workload uses; progress is the liveness
	// bound of the check.
	ttl, progress time.Duration
	// unavailable, set by a scenario, says how the lock refused service
	// cleanly during the fault (no grant, only clean errors).
	unavailable string

	mu    sync.Mutex
	d     *deployment
	g     *dlock.Guarantees // set by a scenario that builds its own Lockers
	stops []func()
}

// victimTTL is the lease of a victim that holds the key across a client
// fault (paused, cut off): as long as the matrix's ZooKeeper session
// allows (4s), so that a ZooKeeper lease rests on the session (a lease
// that outlived it would show as an overlap), and the same on every
// backend.
const victimTTL = zkSession - zkSession/3 - zkTick

func newEnv(t *testing.T, b *backend) *env {
	h := check.NewHistory()
	key := "matrix-" + strings.ReplaceAll(t.Name(), "/", "-")
	return &env{t: t, b: b, h: h, reg: check.NewRegister(h, key), key: key, ttl: 2 * time.Second, progress: 10 * time.Second}
}

// deployment returns the backend's servers, starting the default
// deployment on first use.
func (e *env) deployment() *deployment {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.d == nil {
		e.d = e.b.start(e.t, deployOptions{})
	}
	return e.d
}

// deploy starts the backend's servers with o; call it before any other use
// of the deployment.
func (e *env) deploy(o deployOptions) *deployment {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.d != nil {
		e.t.Fatal("deploy after the deployment was started")
	}
	e.d = e.b.start(e.t, o)
	return e.d
}

// guarantees returns the Guarantees of the cell's Lockers: those a
// scenario that builds its own Lockers reported with useLocker, else a
// Locker's on the deployment.
func (e *env) guarantees() dlock.Guarantees {
	e.mu.Lock()
	g := e.g
	e.mu.Unlock()
	if g != nil {
		return *g
	}
	return e.locker().Guarantees()
}

// useLocker records the Guarantees of l, a Locker the scenario built
// itself (not over the deployment), for the cell's expectation.
func (e *env) useLocker(l *dlock.Locker) *dlock.Locker {
	g := l.Guarantees()
	e.mu.Lock()
	e.g = &g
	e.mu.Unlock()
	return l
}

// locker returns a new Locker over the deployment's servers, as a separate
// process would have, closed when the cell ends.
func (e *env) locker() *dlock.Locker {
	return e.lockerAt(e.deployment().addrs())
}

// lockerAt returns a new Locker over addrs (the servers' addresses or
// proxies in front of them, in the order of the deployment's servers).
func (e *env) lockerAt(addrs []string) *dlock.Locker {
	e.t.Helper()
	u := e.deployment().url(addrs)
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, u)
	if err != nil {
		e.t.Fatalf("Open(%s): %v", u, err)
	}
	e.t.Cleanup(func() { _ = l.Close() })
	return l
}

// proxies puts a servers.Proxy in front of every server of the deployment
// and returns them (closed when the cell ends) with their addresses.
func (e *env) proxies() ([]*servers.Proxy, []string) {
	e.t.Helper()
	var ps []*servers.Proxy
	var addrs []string
	for _, a := range e.deployment().addrs() {
		p, err := servers.NewProxy(a)
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { _ = p.Close() })
		ps = append(ps, p)
		addrs = append(addrs, p.Addr())
	}
	return ps, addrs
}

// goStop runs fn in a goroutine until stop is closed; stopAll (called
// before the check) closes stop and waits for every fn to return. The
// function it returns does the same for this fn alone, earlier (stopAll
// then finds it done).
func (e *env) goStop(fn func(stop <-chan struct{})) func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(stop)
	}()
	end := sync.OnceFunc(func() { close(stop); <-done })
	e.mu.Lock()
	e.stops = append(e.stops, end)
	e.mu.Unlock()
	return end
}

func (e *env) stopAll() {
	e.mu.Lock()
	stops := e.stops
	e.stops = nil
	e.mu.Unlock()
	for _, s := range stops {
		s()
	}
}

// counts returns the grants and the accepted register writes recorded.
func (e *env) counts() (grants, writes int) {
	for _, op := range e.h.Ops() {
		switch {
		case op.Granted():
			grants++
		case op.Kind == check.Write && op.Accepted:
			writes++
		}
	}
	return grants, writes
}

// probe tries the key with l every 10ms (TryAcquire; a grant updates the
// register and is released at once) until the returned stop is called;
// stop returns how many tries were made. A waiter is not woken when a key
// is deleted behind its holder's back (Redis waiters sleep until the key's
// TTL ends), so a scenario probes around a stale release: had the release
// freed the lock, the probe's grant overlaps the holder's lease.
func (e *env) probe(ctx context.Context, l *dlock.Locker) (stop func() int) {
	return e.probeWith(ctx, l, &dlock.AcquireOptions{TTL: e.ttl})
}

// probeWith is probe with the prober's acquire options o: a permit of a
// semaphore (then a stale release that freed another holder's permit shows
// as one permit too many) or a writer. Its critical section is a cycle's
// (see cycle).
func (e *env) probeWith(ctx context.Context, l *dlock.Locker, o *dlock.AcquireOptions) (stop func() int) {
	done := make(chan struct{})
	tries := make(chan int, 1)
	e.goStop(func(stop <-chan struct{}) {
		n := 0
		defer func() { tries <- n }()
		for {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			le, err := e.h.TryAcquire(pctx, "prober", l, e.key, o)
			cancel()
			n++
			if err == nil {
				e.critical(ctx, le, o, 0)
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				_ = le.Release(rctx)
				cancel()
			}
			select {
			case <-done:
				return
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	var once sync.Once
	n := 0
	return func() int {
		once.Do(func() { close(done); n = <-tries })
		return n
	}
}

// waitFor polls cond until it holds, failing t if it does not within bound.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(bound); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("waited %v for %s", bound, what)
		}
	}
}

// awaitOps polls the history until cond holds for its operations, failing
// t if it does not within bound.
func (e *env) awaitOps(t *testing.T, bound time.Duration, what string, cond func([]check.Op) bool) {
	t.Helper()
	waitFor(t, bound, what, func() bool { return cond(e.h.Ops()) })
}

// setupCycle is cycle for a set-up step (or a check once a fault has
// healed) that must succeed: an acquire refused as unavailable is tried
// again, every second, for up to a minute. On a loaded machine under -race
// a round trip can miss a short per-node timeout (Redlock's 50ms) with no
// fault injected; such a refusal says nothing about the scenario, and the
// set-up must not depend on the machine being quiet.
func (e *env) setupCycle(ctx context.Context, client string, l *dlock.Locker, o *dlock.AcquireOptions) error {
	until := time.Now().Add(time.Minute)
	for {
		err := e.cycle(ctx, client, l, o, 10*time.Second, 0)
		if err == nil || !errors.Is(err, dlock.ErrUnavailable) || time.Now().After(until) {
			return err
		}
		e.t.Logf("%s: set-up acquire refused, trying again: %v", client, err)
		if err := pause(ctx, time.Second); err != nil {
			return err
		}
	}
}

// pause waits for d, or until ctx ends (then returns its error).
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// cycle is one client step: acquire the key (waiting up to wait; wait 0:
// TryAcquire, bounded by 10s), go through the critical section for hold
// (see critical), release. It returns the lease's acquire error.
func (e *env) cycle(ctx context.Context, client string, l *dlock.Locker, o *dlock.AcquireOptions, wait, hold time.Duration) error {
	var (
		le  *check.Lease
		err error
	)
	if wait > 0 {
		actx, cancel := context.WithTimeout(ctx, wait)
		le, err = e.h.Acquire(actx, client, l, e.key, o)
		cancel()
	} else {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		le, err = e.h.TryAcquire(actx, client, l, e.key, o)
		cancel()
	}
	if err != nil {
		return err
	}
	e.critical(ctx, le, o, hold)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := le.Release(rctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrLeaseLost) && !errors.Is(err, dlock.ErrUnavailable) {
		e.t.Errorf("%s: Release: %v", client, err)
	}
	return nil
}

// critical is the critical section of le, taken with o, lasting hold: an
// exclusive holder (a mutex's, a read-write lock's writer) updates the
// fenced register; a reader (o.Shared) reads it with its token, which
// fences off the writers before it; a semaphore's permit (o.Permits) only
// holds: its holders are concurrent, so no register judges them, the
// checker's permit count does.
func (e *env) critical(ctx context.Context, le *check.Lease, o *dlock.AcquireOptions, hold time.Duration) {
	switch {
	case o != nil && o.Permits > 0:
		_ = pause(ctx, hold)
	case o != nil && o.Shared:
		e.reg.Read(le.Token())
		_ = pause(ctx, hold)
	default:
		e.reg.Update(ctx, le, hold)
	}
}
