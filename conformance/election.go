package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/observe"
)

// electionTTL is the leader's lease time in the election cases: long
// enough that a hand-over seen within it was not an expiry.
func (s *suite) electionTTL() time.Duration {
	ttl := 10 * time.Second
	if s.lim.MaxTTL > 0 {
		ttl = min(ttl, s.lim.MaxTTL)
	}
	return max(ttl, s.lim.MinTTL)
}

// inspects reports whether the backend can inspect its locks (Leader and
// OnLeader need it).
func (s *suite) inspects(t *testing.T) bool {
	_, err := s.locker(t).Inspect(t.Context(), key(t))
	if errors.Is(err, errors.ErrUnsupported) {
		return false
	}
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return true
}

// candidate is one Run of an Election, with what its leader saw.
type candidate struct {
	e     *dlock.Election
	name  string
	terms chan *dlock.Lease // each term's lease, as lead is called
	done  chan error        // Run's result
}

// campaign starts Run on a new Election on key through l; lead, if not nil,
// runs within each term after the term is reported on c.terms (nil: wait
// for the term's end). The candidate stops when ctx ends.
func campaign(t *testing.T, ctx context.Context, l *dlock.Locker, key, name string, o *dlock.ElectionOptions, lead func(context.Context, *dlock.Lease) error) *candidate {
	t.Helper()
	var opts dlock.ElectionOptions
	if o != nil {
		opts = *o
	}
	opts.Holder = name
	e, err := dlock.NewElection(l, key, &opts)
	if err != nil {
		t.Fatalf("NewElection: %v", err)
	}
	c := &candidate{e: e, name: name, terms: make(chan *dlock.Lease, 100), done: make(chan error, 1)}
	go func() {
		c.done <- e.Run(ctx, func(ctx context.Context, le *dlock.Lease) error {
			c.terms <- le
			if lead != nil {
				return lead(ctx, le)
			}
			<-ctx.Done()
			return nil
		})
	}()
	return c
}

// elected waits for c's next term, within d.
func (c *candidate) elected(t *testing.T, d time.Duration) *dlock.Lease {
	t.Helper()
	select {
	case le := <-c.terms:
		return le
	case err := <-c.done:
		t.Fatalf("candidate %s: Run returned %v before it was elected", c.name, err)
	case <-time.After(d):
		t.Fatalf("candidate %s: not elected within %v", c.name, d)
	}
	return nil
}

// stopped waits for Run to return after its context was cancelled.
func (c *candidate) stopped(t *testing.T) {
	t.Helper()
	select {
	case err := <-c.done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("candidate %s: Run returned %v, want context.Canceled", c.name, err)
		}
	case <-time.After(slack):
		t.Errorf("candidate %s: Run did not return within %v of its context's end", c.name, slack)
	}
}

// electionBadInput: NewElection and Run refuse bad input with typed errors
// before any I/O.
func (s *suite) electionBadInput(t *testing.T) {
	l := s.locker(t)
	for _, c := range []struct {
		key  string
		o    *dlock.ElectionOptions
		want error
	}{
		{"", nil, dlock.ErrInvalidKey},
		{"a\x00b", nil, dlock.ErrInvalidKey},
		{key(t), &dlock.ElectionOptions{TTL: -time.Second}, dlock.ErrInvalidTTL},
		{key(t), &dlock.ElectionOptions{Holder: strings.Repeat("h", backend.MaxHolderLen+1)}, dlock.ErrInvalidConfig},
		{key(t), &dlock.ElectionOptions{Holder: "tab\there"}, dlock.ErrInvalidConfig},
	} {
		_, err := dlock.NewElection(l, c.key, c.o)
		if !errors.Is(err, c.want) {
			t.Errorf("NewElection(%q, %+v): got %v, want an error matching %v", c.key, c.o, err, c.want)
		}
	}
	if _, err := dlock.NewElection(nil, key(t), nil); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("NewElection(nil Locker): got %v, want ErrInvalidConfig", err)
	}
	e, err := dlock.NewElection(l, key(t), nil)
	if err != nil {
		t.Fatalf("NewElection: %v", err)
	}
	if err := e.Run(t.Context(), nil); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("Run(nil): got %v, want ErrInvalidConfig", err)
	}
	// A second Run while one runs.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	first := make(chan error, 1)
	elected := make(chan struct{})
	go func() {
		first <- e.Run(ctx, func(ctx context.Context, _ *dlock.Lease) error {
			close(elected)
			<-ctx.Done()
			return nil
		})
	}()
	select {
	case <-elected:
	case err := <-first:
		t.Fatalf("Run: %v", err)
	case <-time.After(slack):
		t.Fatalf("not elected within %v", slack)
	}
	if err := e.Run(ctx, func(context.Context, *dlock.Lease) error { return nil }); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("a second Run: got %v, want ErrInvalidConfig", err)
	}
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("Run after cancel: %v, want context.Canceled", err)
	}
}

// electionResign: a leader's Resign hands leadership to a waiting candidate
// well within the TTL (so not by expiry), with a higher term; Leader and
// OnLeader report who leads, with the holder each campaigned with.
func (s *suite) electionResign(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	k := key(t)
	ttl := s.electionTTL()
	var (
		mu   sync.Mutex
		seen []dlock.LockInfo
	)
	onLeader := func(i dlock.LockInfo) {
		mu.Lock()
		seen = append(seen, i)
		mu.Unlock()
	}
	inspects := s.inspects(t)
	if !inspects {
		onLeader = nil
	}
	a := campaign(t, ctx, s.locker(t), k, "candidate-a", &dlock.ElectionOptions{TTL: ttl}, nil)
	la := a.elected(t, slack)
	b := campaign(t, ctx, s.locker(t), k, "candidate-b", &dlock.ElectionOptions{TTL: ttl, OnLeader: onLeader}, nil)
	// (A backend whose Inspect cannot tell the token reports 0:
	// Redlock; RunInspect checks Inspect's tokens.)
	if info, err := b.e.Leader(ctx); inspects && (err != nil || !info.Held || info.Holder != "candidate-a" || (info.Token != 0 && info.Token != la.Token())) {
		t.Errorf("Leader() while a leads = %+v, %v; want held by candidate-a with term %d", info, err, la.Token())
	}
	// b's Run is campaigning (or about to): let it line up behind a.
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := a.e.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	select {
	case <-la.Done():
	default:
		t.Error("Resign returned before the leader's lease ended")
	}
	lb := b.elected(t, min(slack, ttl/2))
	t.Logf("hand-over after Resign: %v", time.Since(start).Round(time.Millisecond))
	s.tokenAfter(t, la.Token(), lb.Token())
	if !inspects {
		t.Log("the backend cannot inspect its locks: Leader and OnLeader not checked")
		cancel()
		a.stopped(t)
		b.stopped(t)
		return
	}
	if info, err := a.e.Leader(ctx); err != nil || !info.Held || info.Holder != "candidate-b" {
		t.Errorf("Leader() after the hand-over = %+v, %v; want held by candidate-b", info, err)
	}
	// b's observer reports a, then b (polling backends may report a
	// moment without a leader between them).
	deadline := time.Now().Add(slack)
	for {
		mu.Lock()
		var holders []string
		for _, i := range seen {
			if i.Held {
				holders = append(holders, i.Holder)
			}
		}
		mu.Unlock()
		if strings.Join(holders, ",") == "candidate-a,candidate-b" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("OnLeader reported leaders %q, want candidate-a then candidate-b", holders)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	a.stopped(t)
	b.stopped(t)
	s.noResidue(t, k, "after both candidates stopped")
}

// electionLoss: when the leader's lease is lost (the server drops it), the
// leader's context ends before the lease's Deadline, with a cause matching
// ErrLeaseLost, and the candidate campaigns again.
func (s *suite) electionLoss(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	k := key(t)
	ttl := s.electionTTL()
	type end struct {
		at    time.Time
		cause error
	}
	ended := make(chan end, 10)
	c := campaign(t, ctx, s.locker(t), k, "leader", &dlock.ElectionOptions{TTL: ttl}, func(ctx context.Context, _ *dlock.Lease) error {
		<-ctx.Done()
		ended <- end{time.Now(), context.Cause(ctx)}
		return nil
	})
	le := c.elected(t, slack)
	if err := s.h.Expire(ctx, k); err != nil {
		t.Fatalf("Expire: %v", err)
	}
	select {
	case e := <-ended:
		if !errors.Is(e.cause, dlock.ErrLeaseLost) {
			t.Errorf("the leader's context ended with cause %v, want one matching ErrLeaseLost", e.cause)
		}
		if d := le.Deadline(); !e.at.Before(d) {
			t.Errorf("the leader's context ended at %v, not before the lease's Deadline %v", e.at, d)
		}
	case <-time.After(ttl + slack):
		t.Fatalf("the leader's context did not end within %v of its lease's loss", ttl+slack)
	}
	// It campaigns again and, alone, is elected again with a higher term.
	again := c.elected(t, ttl+slack)
	s.tokenAfter(t, le.Token(), again.Token())
	cancel()
	c.stopped(t)
}

// electionHistory: three candidates campaign while leaders give up (return
// or Resign) and the server drops the leader's lease at random moments;
// the history of terms is checked: no two valid leases at once, terms
// increasing, and every leader's writes to a fenced register whole.
func (s *suite) electionHistory(t *testing.T) {
	const candidates, minTerms = 3, 6
	k := key(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := check.NewHistory()
	reg := check.NewRegister(h, k)
	var (
		mu    sync.Mutex
		terms int
	)
	enough := make(chan struct{})
	var cs []*candidate
	for i := range candidates {
		name := fmt.Sprintf("c%d", i)
		var c *candidate
		ready := make(chan struct{}) // c is set
		// The term's acquire is recorded as invoked when Run's Acquire
		// began (the Locker's Observer sees it), not when lead is
		// called: the grant may come well before, and an expiry
		// injected in between may have dropped it; the history must say
		// so, or the next leader looks like a second holder.
		var began acquireBegan
		l := s.lockerWith(t, &dlock.Options{Observer: &began})
		start := time.Now()
		c = campaign(t, ctx, l, k, name, &dlock.ElectionOptions{TTL: s.electionTTL()}, func(lctx context.Context, le *dlock.Lease) error {
			invoked, ok := began.last()
			if !ok {
				t.Errorf("the harness's NewLocker dropped Options.Observer: the acquires' start is unknown")
				invoked = start // no later than any acquire of this candidate
			}
			cl := h.Granted(name, le, invoked)
			defer cl.GivenUp()
			mu.Lock()
			if terms++; terms == minTerms {
				close(enough)
			}
			mu.Unlock()
			switch rand.IntN(3) {
			case 0: // give up by returning, after a few updates
				for range 1 + rand.IntN(5) {
					reg.Update(lctx, cl, time.Duration(rand.IntN(2000))*time.Microsecond)
				}
				return nil
			case 1: // resign from elsewhere
				go func() {
					time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
					<-ready
					_ = c.e.Resign(ctx)
				}()
			}
			// Lead until the term ends: Resign, or the server drops
			// the lease.
			for lctx.Err() == nil {
				reg.Update(lctx, cl, time.Duration(rand.IntN(2000))*time.Microsecond)
			}
			return nil
		})
		close(ready)
		cs = append(cs, c)
		go func() { // drain: the workload counts terms itself
			for range c.terms {
			}
		}()
	}
	faults := make(chan int)
	go func() {
		n := 0
		defer func() { faults <- n }()
		for {
			select {
			case <-enough:
				return
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(50+rand.IntN(250)) * time.Millisecond):
			}
			begin := time.Now()
			if err := s.h.Expire(ctx, k); err != nil && ctx.Err() == nil {
				t.Errorf("Expire: %v", err)
				return
			}
			h.Expire(k, 0, begin, time.Now())
			n++
		}
	}()
	select {
	case <-enough:
	case <-ctx.Done():
		mu.Lock()
		t.Errorf("only %d terms within a minute, want %d", terms, minTerms)
		mu.Unlock()
	}
	n := <-faults
	cancel()
	for _, c := range cs {
		c.stopped(t)
		close(c.terms)
	}
	s.checkHistory(t, h, 1)
	valid := 0
	for _, sp := range check.Validity(h) {
		if sp.Valid() {
			valid++
		}
	}
	mu.Lock()
	t.Logf("%d terms (%d of them valid for some time, as the checks judge), %d expiries injected", terms, valid, n)
	mu.Unlock()
	// A lease whose wait for the lock spans an injected expiry may have
	// been the one dropped (the expiry names no token), so the checks
	// cannot see it; at least one term must be seen, or they checked
	// nothing.
	if valid == 0 {
		t.Errorf("no term's lease was valid for the checks: the history checked nothing")
	}
}

// electionLeavesNothing: a candidate that was elected, resigned and was
// stopped leaves no goroutine behind, and nothing on the server.
func (s *suite) electionLeavesNothing(t *testing.T) {
	k := key(t)
	var onLeader func(dlock.LockInfo)
	if s.inspects(t) {
		onLeader = func(dlock.LockInfo) {}
	}
	s.leakChecked(t, func(a, b *dlock.Locker) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		ca := campaign(t, ctx, a, k, "a", &dlock.ElectionOptions{TTL: s.electionTTL(), OnLeader: onLeader}, nil)
		ca.elected(t, slack)
		cb := campaign(t, ctx, b, k, "b", &dlock.ElectionOptions{TTL: s.electionTTL(), OnLeader: onLeader}, nil)
		time.Sleep(100 * time.Millisecond)
		if err := ca.e.Resign(ctx); err != nil {
			t.Errorf("Resign: %v", err)
		}
		cb.elected(t, slack)
		cancel()
		ca.stopped(t)
		cb.stopped(t)
	})
	s.noResidue(t, k, "after the candidates stopped")
}

// acquireBegan is an observe.Observer that records when the last Acquire
// of its Locker began.
type acquireBegan struct{ at atomic.Pointer[time.Time] }

// last returns when the last Acquire began; ok is false if none was seen
// (a harness that dropped the Locker's Options).
func (a *acquireBegan) last() (at time.Time, ok bool) {
	if t := a.at.Load(); t != nil {
		return *t, true
	}
	return time.Time{}, false
}

func (a *acquireBegan) AcquireStart(ctx context.Context, _ observe.AcquireStartEvent) context.Context {
	now := time.Now()
	a.at.Store(&now)
	return ctx
}

func (*acquireBegan) AcquireEnd(context.Context, observe.AcquireEndEvent) {}
func (*acquireBegan) Refresh(context.Context, observe.RefreshEvent)       {}
func (*acquireBegan) Release(context.Context, observe.ReleaseEvent)       {}
func (*acquireBegan) LeaseEnd(observe.LeaseEndEvent)                      {}
