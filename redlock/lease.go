package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
)

// nodeState is what a lease knows of one node.
type nodeState uint8

const (
	// statePending: the acquire's reply has not come yet.
	statePending nodeState = iota
	// stateGranted: the node holds our key (as far as we know).
	stateGranted
	// stateFailed: the node's reply was lost (an error, or none in time):
	// it may hold our key.
	stateFailed
	// stateNone: the node holds nothing of ours: it refused the acquire
	// (held by another), or said the key was not ours, or deleted it.
	stateNone
)

// mayHold reports whether a node in state s may hold our key now, or
// later (a pending acquire).
func (s nodeState) mayHold() bool { return s != stateNone }

// lease is a grant on a majority (or, while TryAcquire runs and after a
// failed attempt, the attempt's keys on the nodes).
type lease struct {
	d     *Driver
	keys  []string // lock key, counter key
	value string   // the lock value: holder description + ownership part (redisscript.NewValue)
	token uint64
	ttl   time.Duration
	// passes is the part of the grant's TTL within which a granting
	// node's clock must pass the token for its write-back to be skipped
	// (µs; set with token, before any late reply is handled).
	passes int64

	mu       sync.Mutex
	nodes    []nodeState
	released bool   // Release was called, or the attempt failed: a late grant is deleted at once
	covered  []bool // by node: a release was queued while the acquire was pending (it runs after it)
}

func (l *lease) Token() uint64      { return l.token }
func (l *lease) TTL() time.Duration { return l.ttl }

// releaseTimeout is the per-node timeout of a release.
func (d *Driver) releaseTimeout() time.Duration { return max(d.nodeTimeout, 100*time.Millisecond) }

// releaseCall is the compare-and-delete of l's key; with a token (a granted
// lease), the same script raises the node's counter to it.
func (l *lease) releaseCall() *call {
	c := &call{script: redisscript.Release, keys: l.keys[:1], args: []any{l.value}, parse: intReply, keep: true}
	if l.token > 0 {
		c.keys, c.args = l.keys, []any{l.value, strconv.FormatUint(l.token, 10)}
	}
	return c
}

// releaseOn sends the compare-and-delete to node i without waiting for it
// (bounded by the release timeout; Close waits for it).
func (l *lease) releaseOn(i int) {
	l.d.send(l.d.releaseTimeout(), func(j int) *call {
		if j != i {
			return nil
		}
		return l.releaseCall()
	}).leave(func(a answer) {
		if a.err == nil {
			l.set(a.node, stateNone)
		}
	})
}

func (l *lease) set(i int, s nodeState) {
	l.mu.Lock()
	l.nodes[i] = s
	l.mu.Unlock()
}

// behind reports whether a granting node's reply needs the token written
// back: it issued less than the token, and its clock at the grant (0 if
// unknown), plus the TTL less the drift, does not pass the token.
func (l *lease) behind(r reply) bool {
	t := int64(l.token)
	return r.n < t && t-r.clock >= l.passes
}

// raiseOn writes the token back to node i, in the background (Close waits
// for it).
func (l *lease) raiseOn(i int) {
	t := strconv.FormatUint(l.token, 10)
	l.d.send(cleanupTimeout, func(j int) *call {
		if j != i {
			return nil
		}
		return &call{script: redisscript.Raise, keys: l.keys[1:], args: []any{t}, parse: intReply, keep: true}
	}).leave(nil)
}

// lateAcquire handles an acquire reply that came after TryAcquire had
// decided: a late grant is part of the lease (its token written back if it
// is behind), or deleted at once if the lease is released or the attempt
// failed; a lost reply leaves the node as one that may hold the key.
func (l *lease) lateAcquire(a answer) {
	s := stateOf(a.reply)
	l.mu.Lock()
	l.nodes[a.node] = s
	// A release queued after the acquire runs after it on the node (the
	// per-node order, dispatch.go). (If the acquire's round trip was cut,
	// the acquire may still run after it, on its own connection; sending
	// the release again would not order it either: the key then stays
	// until its TTL, as doc.go says.)
	released := l.released && !l.covered[a.node]
	l.mu.Unlock()
	switch {
	case s == stateNone:
	case released:
		l.releaseOn(a.node)
	case s == stateGranted && l.behind(a.reply):
		l.raiseOn(a.node)
	}
}

// stateOf is the state an acquire reply leaves a node in.
func stateOf(r reply) nodeState {
	switch {
	case r.err != nil:
		return stateFailed
	case r.n > 0:
		return stateGranted
	}
	return stateNone
}

// TryAcquire is one round of the Redlock algorithm: SET NX PX (with a token
// from each node's counter, acquire.lua) on all nodes in parallel, of one
// value on every node: req.Holder followed by the grant's ownership part
// (redisscript.NewValue). It
// returns as soon as the outcome is decided: a grant once a majority has
// granted (with validity left: TTL − elapsed − drift > 0), a refusal once
// too many nodes have refused or failed for a majority to be possible. The
// replies still on their way are handled when they come: a late grant is
// part of the lease (Release deletes it; its token is written back if
// behind, as below), or deleted at once if the attempt failed or the lease
// was released meanwhile.
//
// The token is the largest of the granting majority's (the nodes that had
// answered when the grant was decided); a granting node whose clock would
// not pass it before the lock can expire there gets it written back at
// once, in the background. Release raises the nodes' counters to it. A
// failed attempt deletes the key where it may have been set (nodes that
// granted, or whose reply was lost or is still to come), in the
// background: nodes that refused hold nothing of ours.
func (d *Driver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	key, ttl := req.Key, req.TTL
	ms := ttl.Milliseconds()
	l := &lease{d: d, keys: d.keys(key), value: redisscript.NewValue(req.Holder), ttl: time.Duration(ms) * time.Millisecond, nodes: make([]nodeState, len(d.nodes)), covered: make([]bool, len(d.nodes))}
	start := time.Now()
	timeout := d.nodeTimeoutFor(ttl)
	// "clock": the grant's reply carries the node's clock too.
	args := []any{l.value, ms, "clock"}
	rd := d.send(timeout, func(int) *call {
		return &call{script: redisscript.Acquire, keys: l.keys, args: args, parse: acquireReply}
	})
	var (
		granted, refused, failed int
		token                    int64
		grants                   []answer
		retryAfter               time.Duration
		lastErr                  error
	)
	// Before leave, only this goroutine touches l.nodes.
	cut := rd.wait(ctx, timeout, func(a answer) bool {
		l.nodes[a.node] = stateOf(a.reply)
		switch {
		case a.err != nil:
			failed++
			lastErr = fmt.Errorf("node %d: %w", a.node, a.err)
		case a.n > 0:
			granted++
			token = max(token, a.n)
			grants = append(grants, a)
		default:
			refused++
			if pttl := time.Duration(max(-2-a.n, 0)) * time.Millisecond; pttl > retryAfter {
				retryAfter = pttl
			}
		}
		return granted >= d.quorum || refused+failed > len(d.nodes)-d.quorum
	})
	if cut {
		for i, p := range rd.pending {
			if p {
				failed++
				lastErr = fmt.Errorf("node %d: %w", i, cutErr(ctx, timeout))
			}
		}
	}
	if granted >= d.quorum && d.afterGrant != nil {
		d.afterGrant()
	}
	elapsed := time.Since(start)
	validity := l.ttl - elapsed - d.driftFor(l.ttl)
	if granted >= d.quorum && validity > 0 {
		l.token = uint64(token)
		l.passes = (l.ttl - d.driftFor(l.ttl)).Microseconds()
		// The nodes learn the token when the lease is released: the
		// release script raises their counters to it in the script that
		// deletes the lock, at no extra round trip. A lease that expires
		// unreleased needs no write-back to a node whose clock passes
		// the token before the lock key can expire there: a later grant
		// there issues at least that clock. (Refresh, which can move the
		// expiry earlier, raises the counters in its script.) The other
		// granting nodes (a clock behind the token by about the TTL or
		// more, or a grant of unknown clock) get the token written back
		// now, in the background: the next grant comes only after this
		// lease ends; by then it has landed (or failed: the documented
		// best-effort case). Late grants get the same (lateAcquire).
		for _, a := range grants {
			if l.behind(a.reply) {
				l.raiseOn(a.node)
			}
		}
		rd.leave(l.lateAcquire)
		return l, nil
	}
	// No grant: delete the key where it may be, in the background: on the
	// nodes that granted or failed, and on those still to answer (queued
	// behind the acquire there, so it runs after it, and before a next
	// attempt of this Driver, which would otherwise find its own key).
	l.released = true
	may := make([]bool, len(l.nodes))
	for i, s := range l.nodes {
		l.covered[i] = s == statePending
		may[i] = s.mayHold()
	}
	rd.leave(l.lateAcquire)
	crd := l.d.send(l.d.releaseTimeout(), func(i int) *call {
		if !may[i] {
			return nil
		}
		return l.releaseCall()
	})
	// The deletes are waited for, a little: up to twice the time the
	// refusal took to decide (and at most the release timeout, and
	// while ctx lasts), so that a node merely slower than the others is
	// cleaned before the refusal returns, while a node that does not
	// answer (down, frozen) is not waited for. A split vote's keys left
	// behind while the contenders go back to waiting block the next round
	// of every one of them, and their clean-ups wake them all again:
	// measured with 8 contenders on one key, leaving the clean-up to the
	// background made 3 to 4 times fewer acquisitions.
	crd.wait(ctx, min(l.d.releaseTimeout(), 2*elapsed+time.Millisecond), func(answer) bool { return false })
	crd.leave(func(a answer) {
		if a.err == nil {
			l.set(a.node, stateNone)
		}
	})
	switch {
	case granted < d.quorum && ctx.Err() != nil:
		// The caller gave up: that is no failure of the nodes.
		return nil, fmt.Errorf("%w: %w", backend.ErrNotAcquired, ctx.Err())
	case granted >= d.quorum:
		return nil, fmt.Errorf("%w: redlock: a majority granted, but after %v nothing was left of the %v TTL; lock released", backend.ErrUnavailable, elapsed.Round(time.Millisecond), l.ttl)
	case failed > len(d.nodes)-d.quorum:
		// Too few nodes answered to tell.
		return nil, fmt.Errorf("%w: redlock: %d of %d nodes did not answer (%d needed): %w", backend.ErrUnavailable, failed, len(d.nodes), d.quorum, lastErr)
	}
	return nil, &backend.HeldError{RetryAfter: retryAfter}
}

// acquireReply reads a node's reply to acquire.lua run with the clock
// argument: {token, clock} (decimal strings) for a grant, a negative
// integer when the lock is held.
func acquireReply(v any, err error) reply {
	if err != nil {
		return reply{err: err}
	}
	switch v := v.(type) {
	case int64:
		if v < 0 {
			return reply{n: v}
		}
	case []any:
		if len(v) == 2 {
			t, _ := v[0].(string)
			c, _ := v[1].(string)
			n, err1 := strconv.ParseInt(t, 10, 64)
			clock, err2 := strconv.ParseInt(c, 10, 64)
			if err1 == nil && err2 == nil && n > 0 {
				return reply{n: n, clock: clock}
			}
		}
	}
	return reply{err: fmt.Errorf("redlock: unexpected reply from the acquire script: %v", v)}
}

// intReply reads an integer reply (release, refresh, raise).
func intReply(v any, err error) reply {
	if err != nil {
		return reply{err: err}
	}
	if n, ok := v.(int64); ok {
		return reply{n: n}
	}
	return reply{err: fmt.Errorf("redlock: unexpected reply from a script: %v", v)}
}

// targets returns the nodes that may hold the key (granted, a lost reply,
// or an acquire reply still to come: a release that arrives before that
// acquire finds nothing, and lateAcquire deletes the late grant), and how
// many hold nothing of ours.
func (l *lease) targets() (may []int, none int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, s := range l.nodes {
		if s.mayHold() {
			may = append(may, i)
		} else {
			none++
		}
	}
	return may, none
}

// tally counts compare-and-X replies (1: done, 0: not ours, errors) for
// one lease, starting from the nodes known to hold nothing of ours, and
// records each node's new state.
type tally struct {
	l                *lease
	quorum, n        int
	ok, notOurs, err int
	lastErr          error
}

func (l *lease) newTally(none int) *tally {
	return &tally{l: l, quorum: l.d.quorum, n: len(l.d.nodes), notOurs: none}
}

// add counts a reply; it reports whether the outcome is decided: a
// majority done, or too many not ours for a majority.
func (t *tally) add(a answer, done nodeState) bool {
	switch {
	case a.err != nil:
		t.err++
		t.lastErr = fmt.Errorf("node %d: %w", a.node, a.err)
		t.l.set(a.node, stateFailed)
	case a.n == 1:
		t.ok++
		t.l.set(a.node, done)
	default:
		t.notOurs++
		t.l.set(a.node, stateNone)
	}
	return t.ok >= t.quorum || t.notOurs > t.n-t.quorum
}

// Release deletes the lock where it may still be ours (the nodes that
// granted, whose reply was lost, or whose reply is still to come: the
// delete runs after that acquire on the node; nodes that refused hold
// nothing of ours and get nothing), raising each node's counter to the token in the same
// script (so that no later grant on a node can be issued before it knows
// this token). It returns once the outcome is decided: nil when the lock
// was ours on a majority; ErrNotHeld when a majority says it was not (the
// lease had been lost, whatever a minority still held: it is deleted too).
// The deletes still on their way finish in the background (bounded; Close
// waits for them). A node that deleted the lock but could not publish the
// release (the user may not publish to its channel there) counts as
// released; the Driver logs a warning (warnUnannounced).
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	l.released = true
	for i, s := range l.nodes {
		if s == statePending {
			l.covered[i] = true
		}
	}
	l.mu.Unlock()
	may, none := l.targets()
	t := l.newTally(none)
	timeout := l.d.releaseTimeout()
	rd := l.d.send(timeout, func(i int) *call {
		if !slices.Contains(may, i) {
			return nil
		}
		return l.releaseCall()
	})
	// The release goes on when the caller's ctx has ended; the wait is
	// bounded by the per-node timeout.
	ctx = context.WithoutCancel(ctx)
	cut := rd.wait(ctx, timeout, func(a answer) bool {
		if a.err == nil && a.n == redisscript.ReleasedUnannounced {
			// Deleted, but its release not published: released all
			// the same.
			l.d.warnUnannounced(a.node, l.keys[0])
			a.n = 1
		}
		return t.add(a, stateNone)
	})
	rd.leave(func(a answer) {
		if a.err == nil {
			l.set(a.node, stateNone)
		}
	})
	switch {
	case t.ok >= t.quorum:
		return nil
	case t.notOurs > t.n-t.quorum:
		return fmt.Errorf("%w: redlock: the lock was not ours on %d of %d nodes", backend.ErrNotHeld, t.notOurs, t.n)
	}
	err := t.lastErr
	if cut {
		err = errors.Join(err, cutErr(ctx, timeout))
	}
	return fmt.Errorf("%w: redlock: released on %d of %d nodes: %w", backend.ErrUnavailable, t.ok, t.n, err)
}

// refreshCall is the compare-and-PEXPIRE of l's key to ms, which also
// raises the node's counter to the token.
func (l *lease) refreshCall(ms int64, token string) *call {
	return &call{script: redisscript.Refresh, keys: l.keys, args: []any{l.value, ms, token}, parse: intReply}
}

// Refresh extends the lock where it may still be ours (compare-and-PEXPIRE,
// never SET: a lapsed lock is not revived); it counts only with a
// majority, answered within the asked TTL less the drift, and returns as
// soon as the outcome is decided. The same script raises each node's
// counter to the token: a shorter TTL moves the lock key's expiry earlier
// than the grant's, before the clock of a node whose write-back was
// skipped may have passed the token.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	ms := ttl.Milliseconds()
	start := time.Now()
	may, none := l.targets()
	t := l.newTally(none)
	timeout := l.d.nodeTimeoutFor(ttl)
	token := strconv.FormatUint(l.token, 10)
	rd := l.d.send(timeout, func(i int) *call {
		if !slices.Contains(may, i) {
			return nil
		}
		return l.refreshCall(ms, token)
	})
	cut := rd.wait(ctx, timeout, func(a answer) bool { return t.add(a, stateGranted) })
	granted, err := l.refreshOutcome(t, ms, time.Since(start))
	if errors.Is(err, backend.ErrNotHeld) {
		rd.leave(l.lateRefreshLost)
	} else {
		rd.leave(l.lateRefresh)
	}
	if err != nil && cut {
		err = errors.Join(err, cutErr(ctx, timeout))
	}
	return granted, err
}

// refreshOutcome decides a refresh from its tally; on success it sets the
// lease's TTL. Where the lock is lost, the minority just extended is
// released (in the background), so that it does not block its nodes.
func (l *lease) refreshOutcome(t *tally, ms int64, elapsed time.Duration) (time.Duration, error) {
	ttl := time.Duration(ms) * time.Millisecond
	switch {
	case t.ok >= t.quorum && elapsed < ttl-l.d.driftFor(ttl):
		l.ttl = ttl
		return l.ttl, nil
	case t.notOurs > t.n-t.quorum:
		if t.ok > 0 {
			l.mu.Lock()
			var ext []int
			for i, s := range l.nodes {
				if s == stateGranted || s == stateFailed {
					ext = append(ext, i)
				}
			}
			l.mu.Unlock()
			for _, i := range ext {
				l.releaseOn(i)
			}
		}
		return 0, fmt.Errorf("%w: redlock: the lock is no longer ours on %d of %d nodes", backend.ErrNotHeld, t.notOurs, t.n)
	}
	if t.lastErr == nil {
		return 0, fmt.Errorf("%w: redlock: refresh confirmed on %d of %d nodes (%d needed), or too late for the %v TTL", backend.ErrUnavailable, t.ok, t.n, t.quorum, ttl)
	}
	return 0, fmt.Errorf("%w: redlock: refresh confirmed on %d of %d nodes (%d needed): %w", backend.ErrUnavailable, t.ok, t.n, t.quorum, t.lastErr)
}

// lateRefresh records a refresh reply that came after the outcome.
func (l *lease) lateRefresh(a answer) {
	switch {
	case a.err != nil:
		l.set(a.node, stateFailed)
	case a.n != 1:
		l.set(a.node, stateNone)
	}
}

// lateRefreshLost is lateRefresh for a lease found lost: a node that has
// just extended the key gets it deleted.
func (l *lease) lateRefreshLost(a answer) {
	l.lateRefresh(a)
	if a.err == nil && a.n == 1 {
		l.releaseOn(a.node)
	}
}

// RefreshBatch (backend.BatchRefresher) refreshes many leases at once: the
// refresh scripts of all of them that may be held on a node go to it
// together, in one pipeline (or a few, beyond 1024), the nodes in parallel;
// each lease's outcome is decided by majority as Refresh decides it. The
// per-node timeout is that of the shortest TTL asked, plus 20µs per
// lease, at most a third of that TTL.
func (d *Driver) RefreshBatch(ctx context.Context, reqs []backend.RefreshRequest) {
	if len(reqs) == 0 {
		return
	}
	start := time.Now()
	minTTL := reqs[0].TTL
	var rs []routed
	tallies := make([]*tally, len(reqs))
	left := 0
	for k := range reqs {
		r := &reqs[k]
		l, ok := r.Lease.(*lease)
		if !ok || l.d != d {
			r.Err = fmt.Errorf("%w: redlock: RefreshBatch: a lease of another driver (%T)", backend.ErrInvalidConfig, r.Lease)
			continue
		}
		minTTL = min(minTTL, r.TTL)
		may, none := l.targets()
		tallies[k] = l.newTally(none)
		if tallies[k].notOurs > tallies[k].n-tallies[k].quorum {
			r.Err = fmt.Errorf("%w: redlock: the lock is no longer ours on %d of %d nodes", backend.ErrNotHeld, tallies[k].notOurs, tallies[k].n)
			continue
		}
		token := strconv.FormatUint(l.token, 10)
		ms := r.TTL.Milliseconds()
		for _, i := range may {
			rs = append(rs, routed{node: i, req: k, c: l.refreshCall(ms, token)})
		}
		left++
	}
	if left == 0 {
		return
	}
	timeout := min(d.nodeTimeoutFor(minTTL)+time.Duration(len(reqs))*20*time.Microsecond, max(minTTL/3, d.nodeTimeoutFor(minTTL)))
	rd := d.sendMany(timeout, rs)
	decided := make([]bool, len(reqs))
	// The late replies are handled after RefreshBatch has returned, when
	// reqs is the caller's again: what they need is copied.
	leases := make([]*lease, len(reqs))
	lost := make([]bool, len(reqs))
	for k, t := range tallies {
		if t != nil {
			leases[k] = t.l
		}
	}
	finish := func(k int) {
		r := &reqs[k]
		r.Granted, r.Err = leases[k].refreshOutcome(tallies[k], r.TTL.Milliseconds(), time.Since(start))
		lost[k] = errors.Is(r.Err, backend.ErrNotHeld)
		decided[k] = true
		left--
	}
	late := func(a answer) {
		if lost[a.req] {
			leases[a.req].lateRefreshLost(a)
			return
		}
		leases[a.req].lateRefresh(a)
	}
	answered := make([]int, len(reqs))
	sent := make([]int, len(reqs))
	for _, x := range rs {
		sent[x.req]++
	}
	cut := rd.wait(ctx, timeout, func(a answer) bool {
		k := a.req
		answered[k]++
		if decided[k] {
			late(a)
			return false
		}
		if tallies[k].add(a, stateGranted) || answered[k] == sent[k] {
			finish(k)
		}
		return left == 0
	})
	for k := range reqs {
		if tallies[k] == nil || decided[k] || reqs[k].Err != nil {
			continue
		}
		if cut && ctx.Err() != nil {
			reqs[k].Err = fmt.Errorf("%w: redlock: refresh: %w", backend.ErrUnavailable, ctx.Err())
			decided[k] = true
			continue
		}
		finish(k)
	}
	rd.leave(late)
}
