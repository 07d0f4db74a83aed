package matrix_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
)

// A holder is cut off from every server (a blackholing proxy in front of
// each: its connections stay open, no byte passes) while it holds an
// auto-refreshed lease, for longer than the lease can last: its refreshes
// fail, its Deadline passes and Done fires, the servers let the lock go
// (TTL, lease or session expiry) and contenders, which reach the servers
// directly, take it. Then the partition heals and the old holder goes on
// from where it was cut off: it writes what it read in its critical section
// (a late write, which only the token lets the register refuse) and
// releases (which must not free a contender's lock: a contender waiting
// while another holds would then be granted, an overlap).
func init() {
	register(&scenario{
		order:   30,
		name:    "Partition",
		row:     "holder cut off (blackholing proxy) past its TTL, then healed; it writes and releases",
		applies: all,
		expect:  expectIf(withoutTokens, violation, "without tokens the register cannot refuse the late write of a holder that was cut off past its lease"),
		run:     runPartition,
	})
}

// partitionBound bounds the partition: the lease's end on the client and
// the servers' letting the lock go (ZooKeeper: the 6.3s session timeout,
// rounded up to the server's tick, after the last ping) come well before.
const partitionBound = 15 * time.Second

func runPartition(t *testing.T, e *env) {
	ctx := t.Context()
	fenced := e.guarantees().Fencing != dlock.FencingNone
	ps, addrs := e.proxies()
	victim := e.lockerAt(addrs)

	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	le, err := e.h.Acquire(actx, "victim", victim, e.key, &dlock.AcquireOptions{TTL: victimTTL, AutoRefresh: true})
	cancel()
	if err != nil {
		t.Fatalf("victim's Acquire through the proxies: %v", err)
	}
	// The critical section begins: the victim reads the register.
	read, ok := e.reg.Read(le.Token())
	if !ok {
		t.Fatalf("victim's read with token %d refused", le.Token())
	}
	// A refresh through the proxies works before the partition.
	first := le.Deadline()
	waitFor(t, 5*time.Second, "the victim's lease to be refreshed through the proxies", func() bool {
		return le.Deadline().After(first)
	})

	// Contenders, each its own Locker on direct connections, keep taking
	// the key (they wait for the victim first).
	var (
		holding atomic.Int32 // contenders inside their critical section
		grants  atomic.Int32 // contender grants
	)
	prober := e.locker()
	for i := range 2 {
		l := e.locker()
		name := fmt.Sprintf("contender%d", i)
		e.goStop(func(stop <-chan struct{}) {
			ctx, cancel := stopContext(ctx, stop)
			defer cancel()
			for ctx.Err() == nil {
				actx, acancel := context.WithTimeout(ctx, 20*time.Second)
				cle, err := e.h.Acquire(actx, name, l, e.key, &dlock.AcquireOptions{TTL: e.ttl})
				acancel()
				if err != nil {
					continue // recorded; the checker judges it
				}
				grants.Add(1)
				holding.Add(1)
				e.reg.Update(ctx, cle, 300*time.Millisecond)
				holding.Add(-1)
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				if err := cle.Release(rctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrLeaseLost) {
					t.Errorf("%s: Release: %v", name, err)
				}
				rcancel()
			}
		})
	}

	// The partition: until the victim's lease has ended on its side and a
	// contender has been granted the lock, and for longer than a TTL (the
	// longest the lease can last after its last refresh) and a margin.
	before := grants.Load()
	for _, p := range ps {
		p.Blackhole()
	}
	cut := time.Now()
	waitFor(t, partitionBound, "the cut-off victim's Done to fire and a contender to be granted", func() bool {
		select {
		case <-le.Done():
		default:
			return false
		}
		return grants.Load() > before && time.Since(cut) > victimTTL+500*time.Millisecond
	})
	for _, p := range ps {
		p.Heal()
	}
	t.Logf("partition of %v: the victim's Done fired (%v), %d contender grants meanwhile", time.Since(cut).Round(time.Millisecond), le.Err(), grants.Load()-before)

	// The victim goes on: its late write ...
	accepted := e.reg.Write(le.Client(), le.ID(), le.Token(), le.Deadline(), read)
	switch {
	case accepted && fenced:
		t.Errorf("the register accepted the cut-off victim's late write (token %d): no contender wrote with a higher token while it was cut off", le.Token())
	case accepted:
		t.Logf("the register accepted the cut-off victim's late write (no tokens: it cannot tell)")
	default:
		t.Logf("the register refused the cut-off victim's late write (token %d)", le.Token())
	}
	// ... and its release, while a contender holds the lock (and the
	// other waits for it).
	waitFor(t, 10*time.Second, "a contender to hold the lock", func() bool { return holding.Load() > 0 })
	stopProbe := e.probe(ctx, prober)
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	err = le.Release(rctx)
	rcancel()
	time.Sleep(600 * time.Millisecond) // two contenders' critical sections
	t.Logf("%d probes of the key around the stale release", stopProbe())
	if !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("the cut-off victim's Release = %v, want ErrNotHeld (its lease was lost)", err)
	}
	// Let the contenders go on for a while: had the release freed a
	// contender's lock, the other would be granted while it holds.
	after := grants.Load()
	waitFor(t, 10*time.Second, "two more contender grants after the victim's release", func() bool { return grants.Load() >= after+2 })
}

// stopContext returns a context derived from ctx that is cancelled when
// stop is closed (or cancel called).
func stopContext(ctx context.Context, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// A slow link to a majority of the servers (Redis: its one server;
// Redlock: three of five): a proxy in front of each delays every chunk of
// bytes, each way, by 3/5 of the TTL, so that a round trip takes 1.2 TTL.
// Clients that go through the proxies (connected while the link was fast)
// keep trying to take the key, with Acquire and TryAcquire, each within a
// context of its own. No lease may be handed out while the link is slow:
// a grant that comes back after its deadline is given back (the dlock
// layer's check for every backend; Redlock cuts a node's round trip at its
// per-node timeout, a tenth of the TTL at most, and a round without a
// majority of answers fails), and every attempt must end cleanly
// (ErrNotAcquired or ErrUnavailable) by its context's end, or by the
// bounded give-back after it. Once the link is fast again, the lock serves
// again.
func init() {
	register(&scenario{
		order:   40,
		name:    "SlowLink",
		row:     "slow link (round trip ≥ TTL) to a majority of the servers",
		applies: only(bRedis, bRedlock),
		expect:  expectIf(clockDependent, unavailable, "the lock is refused when the round trips to a majority take longer than the TTL; nothing unsafe is handed out"),
		run:     runSlowLink,
	})
}

// slowAcquireWait is the context of each acquire during the slow link;
// slowOverrun bounds how long after it the acquire may return: clean-ups
// ignore the context's end, within bounds of their own (a grant that came
// back late is given back within 5s, the dlock layer's bound, one round
// trip here unless the connection must be made again; the redis and
// redlock backends delete what a cut attempt may have taken within 2s),
// so 5s and a margin. The pub/sub wake-ups add nothing: internal/redisx/redishub
// returns from Watch when the context ends and unsubscribes in the
// background (before, a failed Watch waited for go-redis to make the
// pub/sub connection again over the slow link, several round trips).
const (
	slowAcquireWait = 3 * time.Second
	slowOverrun     = 6 * time.Second
)

func runSlowLink(t *testing.T, e *env) {
	ctx := t.Context()
	ps, addrs := e.proxies()
	slow := ps[len(ps)-(len(ps)/2+1):] // a majority
	o := &dlock.AcquireOptions{TTL: e.ttl}
	var ls []*dlock.Locker
	for i := range 2 {
		l := e.lockerAt(addrs)
		// While the link is fast: open the connections.
		if err := e.setupCycle(ctx, fmt.Sprintf("slow%d", i), l, o); err != nil {
			t.Fatalf("Acquire through the proxies before the slow link: %v", err)
		}
		ls = append(ls, l)
	}

	oneWay := e.ttl * 3 / 5
	for _, p := range slow {
		p.Delay(oneWay)
	}
	start := time.Now()
	var (
		mu      sync.Mutex
		errs    []error
		granted int
		overrun time.Duration // the most an acquire returned after its context ended
		slowest error         // that acquire's error
		done    = make([]atomic.Int32, len(ls))
		stopped atomic.Bool
		wg      sync.WaitGroup
	)
	defer func() { // also when the cell fails below
		stopped.Store(true)
		wg.Wait()
	}()
	for i, l := range ls {
		name := fmt.Sprintf("slow%d", i)
		wg.Go(func() {
			for !stopped.Load() {
				actx, cancel := context.WithTimeout(ctx, slowAcquireWait)
				dl, _ := actx.Deadline()
				var (
					le  *check.Lease
					err error
				)
				if i%2 == 0 {
					le, err = e.h.TryAcquire(actx, name, l, e.key, o)
				} else {
					le, err = e.h.Acquire(actx, name, l, e.key, o)
				}
				cancel()
				mu.Lock()
				if over := time.Since(dl); over > overrun {
					overrun, slowest = over, err
				}
				if err != nil {
					errs = append(errs, err)
				} else {
					granted++
				}
				mu.Unlock()
				done[i].Add(1)
				if le != nil {
					t.Errorf("%s: granted a lease (token %d, %v left) over the slow link", name, le.Token(), time.Until(le.Deadline()).Round(time.Millisecond))
					rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
					_ = le.Release(rctx)
					rcancel()
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	// Until every client has seen an acquire end, and for a while.
	waitFor(t, 20*time.Second, "an acquire of every client to end over the slow link", func() bool {
		for i := range done {
			if done[i].Load() == 0 {
				return false
			}
		}
		return time.Since(start) > 4*time.Second
	})
	stopped.Store(true)
	wg.Wait()
	healed := time.Now()
	for _, p := range slow {
		p.Heal()
	}
	// Bytes read before the heal keep their delay: the link is slow
	// until they are through.
	e.h.Fault("slow link", start, healed.Add(oneWay))

	var unclean []error
	for _, err := range errs {
		if !errors.Is(err, dlock.ErrNotAcquired) && !errors.Is(err, dlock.ErrUnavailable) {
			unclean = append(unclean, err)
		}
	}
	if len(unclean) > 0 {
		t.Errorf("%d of %d acquires over the slow link failed with an unexpected error, such as: %v", len(unclean), len(errs), unclean[0])
	}
	if overrun > slowOverrun {
		t.Errorf("an acquire over the slow link returned %v after its context's end (bound %v)", overrun.Round(time.Millisecond), slowOverrun)
	}
	summary := slowSummary(errs)
	t.Logf("slow link for %v (one way %v to %d of %d servers): %d acquires, %d granted; %s; returned at most %v after their context's end (%v)",
		healed.Sub(start).Round(time.Millisecond), oneWay, len(slow), len(ps), len(errs)+granted, granted, summary, overrun.Round(time.Millisecond), slowest)
	if granted == 0 && len(unclean) == 0 {
		e.unavailable = fmt.Sprintf("%d acquires refused during the slow link (round trip %v to %d of %d servers, TTL %v): %s",
			len(errs), 2*oneWay, len(slow), len(ps), e.ttl, summary)
	}

	// The link is fast again: the lock serves, through the proxies and
	// directly.
	for i, l := range append(ls, e.locker()) {
		name := fmt.Sprintf("healed%d", i)
		if err := e.setupCycle(ctx, name, l, o); err != nil {
			t.Errorf("%s: Acquire after the slow link healed: %v", name, err)
		}
	}
}

// slowSummary says how the acquires over the slow link failed.
func slowSummary(errs []error) string {
	var late, noMajority, expired, held, other int
	for _, err := range errs {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "arrived after its deadline"):
			late++
		case strings.Contains(msg, "did not answer"):
			noMajority++
		case errors.Is(err, context.DeadlineExceeded):
			expired++
		case errors.Is(err, dlock.ErrNotAcquired):
			held++
		default:
			other++
		}
	}
	var parts []string
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(late, "grants came back after their deadline (validity TTL − elapsed − drift ≤ 0) and were given back")
	add(noMajority, "rounds without a majority of answers within the per-node timeout")
	add(expired, "ended by their context")
	add(held, "found the key held (by a refused grant not given back yet)")
	add(other, "other failures")
	return strings.Join(parts, ", ")
}
