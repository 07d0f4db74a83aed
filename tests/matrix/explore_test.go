package matrix_test

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/tests/servers"
)

// The explorer (issue 20, section 4): where the matrix runs fixed
// scenarios, TestExplore runs random ones on the same framework. Clients
// (each a Locker of its own, through proxies of its own) issue random
// operations: Acquire and TryAcquire with varied TTLs, Refresh with the
// same or another TTL, Release with a cancelled or short context and a
// second Release, Close during an operation, AutoRefresh on and off,
// bursts of short cycles on few keys (the etcd lease pool's reuse path)
// and long holds. Faults are drawn at random too: on a client's proxies
// (a blackhole, a slow link, a single request failed or a single reply
// dropped with servers.Proxy.FailNext, connections reset), some aimed at
// one operation (a Release cut off from the servers, a Refresh to another
// TTL whose reply is lost), and on the servers (kill -9 and restart, a
// pause, the lock dropped as an expiry would).
//
// After a run the history is checked (conformance/check: mutual
// exclusion, token order, lost updates, stale writes), and so are the
// invariants the explorer checked as it went (explorer.finding): a grant
// gets the TTL it asked for (at least nine tenths of it: etcd may hand out
// a pooled lease renewed within the last tenth of its TTL); a held lease's
// Deadline is never past the server's own expiry for it (etcd: the
// TimeToLive of the lease the lock key is on; Redis: the PTTL of the lock
// key, whose fencing counter must still be the lease's token; Redlock: the
// PTTL on a majority of the nodes; ZooKeeper: the expiry of the lock
// node's session on the leader, which it prints to the second only, so
// there the check has a second's slack); a released
// lease's key is gone; and no lease ends before its Deadline (Done fired
// by the backend, or the key found gone) unless the explorer dropped its
// lock, nor an auto-refreshed one while no fault was injected.
//
// On a backend that serves shared leases (Guarantees.Shared: Redis, etcd,
// ZooKeeper), some keys are semaphores or read-write locks as well
// (explore_shared_test.go): operations on them draw a shared acquire or
// the writer's exclusive one, shared holders do not write the register,
// the checker's permit count judges them, every audit above applies to
// them, and a holder now and then asks for its key with another Permits,
// which must fail at once with a *dlock.PermitsError.
//
// An auto-refreshed lease is also refreshed by hand, to shorter and
// longer TTLs than asked: the watchdog must follow (an early version of
// this explorer left that out, as the library then lost such leases and
// let a shortening refresh in flight claim the longer Deadline: both fixed
// in 14a0209).
//
// A consensus backend (etcd, ZooKeeper) may show none of these. A
// clock-dependent one (Redis, Redlock) may show its documented unsafety
// only where the faults admit it: around a crash of a server that keeps
// its locks in memory during the lease's life. Redlock's Guarantees say
// its exclusion rests on "nodes that restart without the lock staying down
// for a TTL", and the explorer restarts them at once: a grant that reached
// only a bare majority loses it with one such crash, whatever
// ToleratedFailures (which counts nodes that may be down, not restarted
// empty).
//
// Each run has a seed, logged at its start and with every failure; the
// seed fixes every random draw (the operations, their parameters, the
// faults and their moments), so DLOCK_EXPLORE_SEED=N replays the same
// sequence of draws. Timing is not replayed: an outcome (a grant, a
// timeout) may differ, and the run then goes another way from there.
//
// Knobs (environment):
//   - DLOCK_EXPLORE_SEED: the seed of a single run (default: a fresh one
//     per run);
//   - DLOCK_EXPLORE_BACKEND: the backends, comma-separated names as in
//     the matrix (Redis, Redlock, etcd, ZooKeeper; any case; default all,
//     in parallel);
//   - DLOCK_EXPLORE_BUDGET: how long each run issues operations (default
//     60s; servers' start and the check come on top);
//   - DLOCK_EXPLORE_SOAK: keep starting runs with fresh seeds, per
//     backend, until this much time has passed from the backend's start
//     (default 0: one run); go test runs GOMAXPROCS parallel tests at
//     once, so pass -parallel 4 (make soak does) or, on a 2-core
//     machine, two backends start only after the others' whole soak.
//
// `make explore SEED=N BACKEND=B` replays a run, `make soak DURATION=1h`
// soaks; `make test` runs one run per backend with a fresh seed, under
// -race, and one more on ZooKeeper without -race, where it draws the
// faults that go-zookeeper's own data races keep out of a -race build
// (explorer.resets).
//
// On the etcd lease pool before its fixes (issue 20, 2a-2c), 60s runs
// found each defect within the run: the decaying grant in 20 of 20
// seeds, a recycled lease revoked under its next holder in 10, a key
// kept on a lease nobody renews in 17.
func TestExplore(t *testing.T) {
	if os.Getenv("DLOCK_TEST_NETWORK") != "host" {
		msg := "the explorer needs host networking (DLOCK_TEST_NETWORK=host), as the fault matrix does: restarted servers must keep their ports"
		if os.Getenv("DLOCK_REQUIRE_SERVERS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	knobs, err := exploreKnobs()
	if err != nil {
		t.Fatal(err)
	}
	leaks := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait")}
	t.Run("backends", func(t *testing.T) {
		for _, b := range backends {
			if len(knobs.backends) > 0 && !slices.Contains(knobs.backends, strings.ToLower(b.name)) {
				continue
			}
			t.Run(b.name, func(t *testing.T) {
				t.Parallel()
				end := time.Now().Add(knobs.soak)
				for i := 0; i == 0 || (knobs.seed == nil && time.Now().Before(end)); i++ {
					seed := rand.Uint64()
					if knobs.seed != nil {
						seed = *knobs.seed
					}
					t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
						explore(t, b, seed, knobs.budget)
					})
				}
			})
		}
	})
	// The clients' Lockers are closed by the runs' cleanups; a goroutine
	// of theirs left behind is a leak of the lock's.
	if err := goleak.Find(leaks...); err != nil {
		t.Errorf("goroutines left after the runs: %v", err)
	}
}

// exploreKnobs are TestExplore's settings, from the environment.
type exploreSettings struct {
	seed     *uint64
	backends []string // lower case; empty: all
	budget   time.Duration
	soak     time.Duration
}

func exploreKnobs() (exploreSettings, error) {
	k := exploreSettings{budget: 60 * time.Second}
	if v := os.Getenv("DLOCK_EXPLORE_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return k, fmt.Errorf("DLOCK_EXPLORE_SEED=%q: %w", v, err)
		}
		k.seed = &n
	}
	if v := os.Getenv("DLOCK_EXPLORE_BACKEND"); v != "" {
		for name := range strings.SplitSeq(v, ",") {
			name = strings.ToLower(strings.TrimSpace(name))
			if !slices.ContainsFunc(backends, func(b *backend) bool { return strings.ToLower(b.name) == name }) {
				return k, fmt.Errorf("DLOCK_EXPLORE_BACKEND=%q: no backend %q (Redis, Redlock, etcd, ZooKeeper)", v, name)
			}
			k.backends = append(k.backends, name)
		}
	}
	for _, d := range []struct {
		env string
		to  *time.Duration
	}{{"DLOCK_EXPLORE_BUDGET", &k.budget}, {"DLOCK_EXPLORE_SOAK", &k.soak}} {
		if v := os.Getenv(d.env); v != "" {
			n, err := time.ParseDuration(v)
			if err != nil || n < 0 {
				return k, fmt.Errorf("%s=%q: want a duration such as 60s", d.env, v)
			}
			*d.to = n
		}
	}
	return k, nil
}

// explore makes one run on b with seed: servers, clients and faults for
// budget, then the check.
func explore(t *testing.T, b *backend, seed uint64, budget time.Duration) {
	norace := ""
	if !servers.RaceDetector {
		norace = " RACE=off" // ZooKeeper draws other faults without -race (explorer.resets)
	}
	replay := fmt.Sprintf("seed %d (replay: make explore SEED=%d BACKEND=%s%s; the same draws, timing may differ)", seed, seed, b.name, norace)
	t.Logf("%s, %v of operations", replay, budget)
	defer func() {
		if t.Failed() {
			t.Logf("FAILED: %s", replay)
		}
	}()
	e := newEnv(t, b)
	x := newExplorer(t, e, seed)
	defer e.stopAll()
	x.run(budget)
	e.stopAll()
	x.judge()
}

// judge checks the history and the findings, and fails t for those the
// backend's Guarantees do not admit.
func (x *explorer) judge() {
	t := x.t
	vs := check.Check(x.e.h, check.Options{})
	var (
		bad, admitted []string
		kinds         = map[string]int{} // violations not admitted, by kind
		examples      []string           // the first two of each kind
	)
	ops := x.e.h.Ops()
	judge := func(kind, what string, from, to time.Time, leases ...int) {
		if why := x.admits(from, to); why != "" {
			admitted = append(admitted, what+" (admitted: "+why+")")
			return
		}
		bad = append(bad, what)
		if kinds[kind]++; kinds[kind] <= 2 {
			examples = append(examples, kind+": "+what+"\n"+x.explain(ops, from, to, leases...))
		}
	}
	for _, v := range vs {
		if !v.Property.Safety() {
			continue
		}
		from, to := earliest(v.A.Start, v.B.Start), latest(v.A.Deadline, v.B.Deadline, v.A.End, v.B.End)
		judge(string(v.Property), v.String(), from.Add(-time.Second), to, v.A.ID, v.B.ID, v.A.Lease, v.B.Lease)
	}
	x.lossFindings()
	x.mu.Lock()
	fs := slices.Clone(x.findings)
	x.mu.Unlock()
	for _, f := range fs {
		judge(f.kind, f.what, f.from, f.to, f.lease)
	}
	t.Logf("%s: %s", x.e.b.name, x.stats())
	var counts []string
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		counts = append(counts, fmt.Sprintf("%s %d", k, kinds[k]))
	}
	t.Logf("violations: %d (%d admitted by the faults) %s", len(bad)+len(admitted), len(admitted), strings.Join(counts, ", "))
	for _, a := range firstStrings(admitted, 5) {
		t.Logf("admitted: %s", a)
	}
	if len(bad) > 0 {
		t.Errorf("%d violations the backend's Guarantees do not admit (seed %d): %s; such as:\n%s",
			len(bad), x.seed, strings.Join(counts, ", "), strings.Join(examples, "\n"))
		for i, b := range firstStrings(bad, 100) {
			t.Logf("violation %d: %s", i+1, b)
		}
	}
	if x.count("grant") == 0 {
		t.Errorf("no lease was granted: the run exercised nothing")
	}
}

func firstStrings(s []string, n int) []string { return s[:min(n, len(s))] }

// explain lists, for a failure report, the operations of the leases
// granted by the acquires leases (0s ignored) and the faults recorded in
// the history between from and to (at most 40 lines).
func (x *explorer) explain(ops []check.Op, from, to time.Time, leases ...int) string {
	at := x.at
	var lines []string
	for _, op := range ops {
		mine := op.ID != 0 && (slices.Contains(leases, op.ID) || (op.Lease != 0 && slices.Contains(leases, op.Lease)))
		fault := (op.Kind == check.Fault || op.Kind == check.Expire) && !op.Start.After(to) && !op.End.Before(from)
		if !mine && !fault {
			continue
		}
		line := fmt.Sprintf("\t\t#%d %s %s %s %s..%s", op.ID, op.Kind, op.Client, op.Key, at(op.Start), at(op.End))
		switch {
		case op.Kind == check.Acquire:
			line += fmt.Sprintf(" token %d TTL %v Deadline %s err %v", op.Token, op.TTL, at(op.Deadline), op.Err)
			if op.Shared {
				line += " " + xshare{shared: true, permits: op.Permits}.String()
			}
		case op.Kind == check.Fault:
			line += " " + op.Name
		case op.Kind == check.Expire:
			line += fmt.Sprintf(" token %d", op.Token)
		case op.Kind == check.Write:
			line += fmt.Sprintf(" accepted %v Deadline %s", op.Accepted, at(op.Deadline))
		default:
			line += fmt.Sprintf(" Deadline %s err %v", at(op.Deadline), op.Err)
		}
		lines = append(lines, line)
	}
	x.mu.Lock()
	for _, id := range leases {
		for _, tr := range x.traces[id] {
			lines = append(lines, fmt.Sprintf("\t\tlease #%d: %s", id, tr))
		}
	}
	for name, ws := range x.cfaults {
		for _, w := range ws {
			if !w.from.After(to) && !w.to.Before(from) {
				lines = append(lines, fmt.Sprintf("\t\tfault on %s's proxies %s..%s", name, at(w.from), at(w.to)))
			}
		}
	}
	x.mu.Unlock()
	if len(lines) > 40 {
		lines = append(lines[:40], "\t\t…")
	}
	return strings.Join(lines, "\n")
}

func earliest(ts ...time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if !t.IsZero() && (m.IsZero() || t.Before(m)) {
			m = t
		}
	}
	return m
}

func latest(ts ...time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if t.After(m) {
			m = t
		}
	}
	return m
}

// admits says why the faults of the run admit a violation seen between
// from and to, or "" if they do not: a backend that issues no
// consensus-grade tokens or rests on clocks (Redis, Redlock) loses locks
// in crashes of servers that keep them in memory, restarted at once, and
// admits a violation near any such crash (see TestExplore's doc); a
// consensus backend admits none.
func (x *explorer) admits(from, to time.Time) string {
	g := x.g
	if g.Fencing == dlock.FencingConsensus && !g.ClockDependent {
		return ""
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	n := 0
	for _, c := range x.crashes {
		if !c.Before(from.Add(-x.maxTTL)) && !c.After(to) {
			n++
		}
	}
	if n > 0 {
		return fmt.Sprintf("%d server crashes without persistence (restarted at once) around it", n)
	}
	return ""
}

// lossFindings adds a finding for every lease whose Done fired before its
// Deadline (the backend saw its lock gone: another holder's key deleted,
// or its own lease ended early on the server) unless the explorer dropped
// the key's lock meanwhile, and for every auto-refreshed lease lost while
// no fault was injected at all (the watchdog must keep it).
func (x *explorer) lossFindings() {
	ops := x.e.h.Ops()
	byID := map[int]check.Op{}
	for _, op := range ops {
		if op.Granted() {
			byID[op.ID] = op
		}
	}
	for _, op := range ops {
		if op.Kind != check.Lost || errors.Is(op.Err, dlock.ErrClosed) {
			continue
		}
		acq, ok := byID[op.Lease]
		if !ok {
			continue
		}
		if x.expiredBetween(acq.Key, acq.Start, op.Start) {
			continue
		}
		x.mu.Lock()
		unknown := x.leases[acq.ID].unknown
		x.mu.Unlock()
		if unknown && strings.Contains(op.Err.Error(), "no longer ours") {
			// A refresh found the lock not where the client kept it:
			// after a refresh whose outcome was unknown, the lock may
			// still be held on the server (by a lease the client
			// does not keep alive); giving up early is safe.
			continue
		}
		if early := op.Deadline.Sub(op.Start); early > time.Millisecond {
			x.find(acq.ID, acq.Start, op.Start, kindEarlyLoss, "lease #%d (%s, key %q, token %d, TTL %v asked %v) lost %v before its Deadline, its lock not dropped by the explorer: %v%s",
				acq.ID, acq.Client, acq.Key, acq.Token, acq.TTL, x.asked(acq.ID), early.Round(time.Millisecond), op.Err, x.carried(acq.ID))
			continue
		}
		if x.isAuto(acq.ID) && !x.faultedBetween(acq.Client, acq.Start.Add(-time.Second), op.Start) {
			x.find(acq.ID, acq.Start, op.Start, kindAutoLost, "auto-refreshed lease #%d (%s, key %q, token %d, TTL %v asked %v) lost %v after its grant while no fault was injected: %v",
				acq.ID, acq.Client, acq.Key, acq.Token, acq.TTL, x.asked(acq.ID), op.Start.Sub(acq.End).Round(time.Millisecond), op.Err)
		}
	}
}

// exploreStats counts what a run did, by name.
type exploreStats struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *exploreStats) add(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	s.n[name]++
}

func (s *exploreStats) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[name]
}

func (s *exploreStats) stats() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.n))
	total := 0
	for k, v := range s.n {
		names = append(names, k)
		if strings.HasPrefix(k, "op ") {
			total += v
		}
	}
	slices.Sort(names)
	parts := []string{fmt.Sprintf("%d operations", total)}
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s %d", k, s.n[k]))
	}
	return strings.Join(parts, ", ")
}
