package check

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Property names what a [Violation] breaks.
type Property string

// The properties Check checks.
const (
	MutualExclusion Property = "mutual exclusion"
	PermitCount     Property = "permit count"
	TokenOrder      Property = "token order"
	LostUpdate      Property = "lost update"
	StaleWrite      Property = "stale write accepted"
	Liveness        Property = "liveness"
)

// Safety reports whether p is a safety property (all but Liveness).
func (p Property) Safety() bool { return p != Liveness }

// Violation is one breach of a property: the two operations involved (B is
// the zero Op where one suffices) and what happened, with times relative to
// the history's start.
type Violation struct {
	Property Property
	A, B     Op
	Detail   string
}

// String returns the property and the detail, as one line.
func (v Violation) String() string { return string(v.Property) + ": " + v.Detail }

// Options tunes Check.
type Options struct {
	// Progress is the longest time an acquire may wait, outside fault
	// windows, without any acquire on its key being granted. 0 skips the
	// liveness check.
	Progress time.Duration
}

// Check checks the operations of h and returns the violations found, in a
// stable order.
func Check(h *History, o Options) []Violation {
	c := &checker{begin: h.Begin(), ops: h.Ops(), o: o}
	c.index()
	c.mutualExclusion()
	c.permitCount()
	c.tokenOrder()
	c.register()
	if o.Progress > 0 {
		c.liveness()
	}
	return c.found
}

type lease struct {
	acq        Op
	start, end time.Time // the interval in which it was valid
	why        string    // what ended it
	// held is when the lease may have held the key until, for progress:
	// end, but not cut by an expiry that may have come before its grant.
	held time.Time
}

type checker struct {
	begin  time.Time
	ops    []Op
	o      Options
	leases map[string][]*lease // by key, in grant order
	byID   map[int]*lease
	faults []Op
	found  []Violation
}

// at formats t relative to the history's start.
func (c *checker) at(t time.Time) string {
	return "+" + t.Sub(c.begin).Round(time.Microsecond).String()
}

func (c *checker) add(p Property, a, b Op, format string, args ...any) {
	c.found = append(c.found, Violation{Property: p, A: a, B: b, Detail: fmt.Sprintf(format, args...)})
}

func (c *checker) describe(l *lease) string {
	return fmt.Sprintf("lease #%d (%s, token %d, granted %s, valid until %s: %s)",
		l.acq.ID, l.acq.Client, l.acq.Token, c.at(l.start), c.at(l.end), l.why)
}

// index builds each lease's validity interval.
func (c *checker) index() {
	c.leases = map[string][]*lease{}
	c.byID = map[int]*lease{}
	for _, op := range c.ops {
		if op.Granted() {
			l := &lease{acq: op, start: op.End, end: op.Deadline, why: "Deadline"}
			c.leases[op.Key] = append(c.leases[op.Key], l)
			c.byID[op.ID] = l
		}
	}
	// A later observation of the Deadline (refreshed by a watchdog)
	// extends it: the holder may have relied on any Deadline it was shown.
	// A Refresh that succeeded sets it, shorter or not, for what follows:
	// the holder asked for that TTL (one recorded without a Deadline sets
	// nothing). In the order observed: a Refresh when it returned, the
	// others when invoked (their Deadline is read then).
	type seen struct {
		at  time.Time
		op  Op
		set bool
	}
	obs := map[*lease][]seen{}
	for _, op := range c.ops {
		l := c.byID[op.Lease]
		switch {
		case l == nil:
		case op.Kind == Refresh:
			obs[l] = append(obs[l], seen{op.End, op, true})
		case op.Kind == Write || op.Kind == Release || op.Kind == Lost:
			obs[l] = append(obs[l], seen{op.Start, op, false})
		}
	}
	for l, ss := range obs {
		slices.SortStableFunc(ss, func(a, b seen) int { return a.at.Compare(b.at) })
		for _, o := range ss {
			if o.set && !o.op.Deadline.IsZero() || o.op.Deadline.After(l.end) {
				l.end = o.op.Deadline
			}
		}
	}
	for _, l := range c.byID {
		l.held = l.end
	}
	cut := func(l *lease, t time.Time, why string) {
		if t.Before(l.end) {
			l.end, l.why = t, why
		}
		if t.Before(l.held) {
			l.held = t
		}
	}
	for _, op := range c.ops {
		switch op.Kind {
		case Release:
			if l := c.byID[op.Lease]; l != nil {
				cut(l, op.Start, "release invoked")
			}
		case Lost:
			if l := c.byID[op.Lease]; l != nil {
				cut(l, op.Start, "Done fired")
			}
		case Expire:
			for _, l := range c.leases[op.Key] {
				switch {
				case op.Token != 0 && l.acq.Token == op.Token:
					cut(l, op.Start, "expired by the server")
				case op.Token == 0 && l.acq.Start.Before(op.End):
					// It may be the lease dropped, if granted before
					// the drop; progress counts it held if its grant
					// may have come after.
					held := l.held
					cut(l, op.Start, "may have been expired by the server")
					if l.acq.End.After(op.Start) {
						l.held = held
					}
				}
			}
		case Fault:
			c.faults = append(c.faults, op)
		}
	}
	for _, ls := range c.leases {
		slices.SortFunc(ls, func(a, b *lease) int { return a.start.Compare(b.start) })
	}
	for _, l := range c.byID {
		if l.end.Before(l.start) {
			l.end = l.start // granted already expired: never valid
		}
		if l.held.Before(l.start) {
			l.held = l.start
		}
	}
}

// Span is the interval in which a lease was valid, as Check judges it.
type Span struct {
	Lease      int       // the ID of the Acquire op that granted it
	Start, End time.Time // from the acquire's return until the first end below
	Why        string    // what ended it: "Deadline", "release invoked", "Done fired", "expired by the server", …
}

// Valid reports whether the lease was valid for some time. A lease granted
// past its Deadline, or cut by an expiry before its grant returned, was
// not, and the mutual exclusion check cannot see it.
func (s Span) Valid() bool { return s.Start.Before(s.End) }

// Validity returns the validity interval of every lease granted in h, in
// the order of grants, so a workload can tell how many leases the checks
// could see.
func Validity(h *History) []Span {
	c := &checker{begin: h.Begin(), ops: h.Ops()}
	c.index()
	var spans []Span
	for _, op := range c.ops {
		if l := c.byID[op.ID]; l != nil {
			spans = append(spans, Span{Lease: op.ID, Start: l.start, End: l.end, Why: l.why})
		}
	}
	return spans
}

func (c *checker) mutualExclusion() {
	for _, key := range sortedKeys(c.leases) {
		ls := c.leases[key]
		for i, a := range ls {
			if !a.start.Before(a.end) {
				continue // never valid
			}
			for _, b := range ls[i+1:] {
				if !b.start.Before(b.end) || !b.start.Before(a.end) {
					continue // b starts after a ended (ls is by start)
				}
				if a.acq.Shared && b.acq.Shared {
					continue // counted by permitCount
				}
				if !a.start.Before(b.end) {
					continue
				}
				overlap := earlier(a.end, b.end).Sub(b.start)
				c.add(MutualExclusion, a.acq, b.acq, "key %q: %s and %s were both valid for %v",
					key, c.describe(a), c.describe(b), overlap.Round(time.Microsecond))
			}
		}
	}
}

// permitCount: when a shared lease's validity begins, the shared leases
// valid then (itself included) are at most its Permits (when > 0).
func (c *checker) permitCount() {
	for _, key := range sortedKeys(c.leases) {
		ls := c.leases[key]
		for i, b := range ls {
			if !b.acq.Shared || b.acq.Permits == 0 || !b.start.Before(b.end) {
				continue
			}
			var with []*lease
			for _, a := range ls[:i+1] { // ls is by start
				if a.acq.Shared && a.start.Before(a.end) && b.start.Before(a.end) {
					with = append(with, a)
				}
			}
			if len(with) > b.acq.Permits {
				var ds []string
				for _, a := range with {
					ds = append(ds, c.describe(a))
				}
				c.add(PermitCount, with[0].acq, b.acq, "key %q: %d shared leases valid at %s, more than the %d permits: %s",
					key, len(with), c.at(b.start), b.acq.Permits, strings.Join(ds, "; "))
			}
		}
	}
}

func earlier(x, y time.Time) time.Time {
	if y.Before(x) {
		return y
	}
	return x
}

// tokenOrder: b must have a larger token than a when b's acquire was
// invoked after a's returned (b's grant came later on the server), or when
// both leases were valid for a while and b's validity began after a's
// ended (on a lock that keeps mutual exclusion, a's grant then came first:
// had b's come first, b's lock would have been held or dropped before a's
// grant, and b's validity would have ended before a's began).
func (c *checker) tokenOrder() {
	for _, key := range sortedKeys(c.leases) {
		ls := c.leases[key]
		for _, a := range ls {
			for _, b := range ls {
				if a == b || a.acq.Token == 0 || b.acq.Token == 0 || b.acq.Token > a.acq.Token {
					continue
				}
				switch {
				case b.acq.Start.After(a.acq.End):
					c.add(TokenOrder, a.acq, b.acq, "key %q: acquire #%d (%s) returned token %d at %s; acquire #%d (%s), invoked later at %s, got token %d",
						key, a.acq.ID, a.acq.Client, a.acq.Token, c.at(a.acq.End), b.acq.ID, b.acq.Client, c.at(b.acq.Start), b.acq.Token)
				case a.start.Before(a.end) && b.start.Before(b.end) && !b.start.Before(a.end) && !(a.acq.Shared && b.acq.Shared):
					c.add(TokenOrder, a.acq, b.acq, "key %q: %s ended before %s began, but its token is not smaller",
						key, c.describe(a), c.describe(b))
				}
			}
		}
	}
}

func (c *checker) register() {
	writes := map[string][]Op{}
	for _, op := range c.ops {
		if op.Kind == Write {
			writes[op.Key] = append(writes[op.Key], op)
		}
	}
	for _, key := range sortedKeys(writes) {
		ws := writes[key]
		slices.SortFunc(ws, func(a, b Op) int { return cmp.Compare(a.Seq, b.Seq) })
		var (
			prev     *Op
			accepted []Op
		)
		for i := range ws {
			w := ws[i]
			if !w.Accepted {
				continue
			}
			if prev != nil && w.Read != prev.Wrote {
				c.add(LostUpdate, *prev, w, "register %q: write #%d (%s, token %d, at %s) read %d, but write #%d (%s, token %d, at %s) had written %d",
					key, w.ID, w.Client, w.Token, c.at(w.Start), w.Read, prev.ID, prev.Client, prev.Token, c.at(prev.Start), prev.Wrote)
			} else if prev == nil && w.Read != 0 {
				c.add(LostUpdate, w, Op{}, "register %q: write #%d (%s, token %d) read %d before any write", key, w.ID, w.Client, w.Token, w.Read)
			}
			for _, a := range accepted {
				if a.Lease != w.Lease && a.Token >= w.Token {
					c.add(StaleWrite, a, w, "register %q: write #%d (%s, lease #%d, token %d, at %s) was accepted after write #%d (%s, lease #%d, token %d, at %s)",
						key, w.ID, w.Client, w.Lease, w.Token, c.at(w.Start), a.ID, a.Client, a.Lease, a.Token, c.at(a.Start))
					break
				}
			}
			accepted = append(accepted, w)
			prev = &ws[i]
		}
	}
}

// liveness: per key, the longest stretch in which some waiting acquire was
// pending while no lease on the key was valid, outside every fault window,
// with no grant on the key; and acquires that failed as unavailable outside
// fault windows (or overlapped by an injected expiry of their key, which
// may drop a waiter's own state). A holder that stops (paused, cut off, crashed) keeps its
// key until its lease's validity ends; from then the server must free the
// key within the bound.
func (c *checker) liveness() {
	inFault := func(t time.Time) bool {
		for _, f := range c.faults {
			if !t.Before(f.Start) && !t.After(f.End) {
				return true
			}
		}
		return false
	}
	type span struct{ from, to time.Time }
	byKey := map[string][]Op{}
	for _, op := range c.ops {
		if op.Kind == Acquire {
			byKey[op.Key] = append(byKey[op.Key], op)
			if op.Err != nil && errUnavailable(op.Err) && !inFault(op.End) && !c.expiredDuring(op) {
				c.add(Liveness, op, Op{}, "acquire #%d (%s) on %q failed at %s outside any fault window: %v",
					op.ID, op.Client, op.Key, c.at(op.End), op.Err)
			}
		}
	}
	for _, key := range sortedKeys(byKey) {
		acqs := byKey[key]
		// Points where the state can change: starts and ends of waiting
		// acquires, grants, fault bounds.
		var pts []time.Time
		for _, a := range acqs {
			pts = append(pts, a.Start, a.End)
		}
		for _, f := range c.faults {
			pts = append(pts, f.Start, f.End)
		}
		for _, l := range c.leases[key] {
			pts = append(pts, l.start, l.held)
		}
		slices.SortFunc(pts, func(a, b time.Time) int { return a.Compare(b) })
		waiting := func(from, to time.Time) *Op { // an acquire pending over all of [from, to]
			for i := range acqs {
				a := &acqs[i]
				if a.Wait && !a.Start.After(from) && !a.End.Before(to) {
					return a
				}
			}
			return nil
		}
		held := func(t time.Time) bool { // a lease on key may have held it at t
			for _, l := range c.leases[key] {
				if !t.Before(l.start) && t.Before(l.held) {
					return true
				}
			}
			return false
		}
		granted := func(from, to time.Time) bool {
			for _, a := range acqs {
				if a.Granted() && a.End.After(from) && !a.End.After(to) {
					return true
				}
			}
			return false
		}
		// Walk the elementary intervals, extending a stretch while an
		// acquire waits, no fault is on and nothing is granted.
		var cur *span
		var who *Op
		flush := func() {
			if cur != nil && cur.to.Sub(cur.from) > c.o.Progress {
				c.add(Liveness, *who, Op{}, "key %q: no acquire was granted from %s to %s (%v, bound %v) while acquire #%d (%s) waited and no fault was declared",
					key, c.at(cur.from), c.at(cur.to), cur.to.Sub(cur.from).Round(time.Millisecond), c.o.Progress, who.ID, who.Client)
			}
			cur, who = nil, nil
		}
		for i := 0; i+1 < len(pts); i++ {
			from, to := pts[i], pts[i+1]
			if !from.Before(to) {
				continue
			}
			mid := from.Add(to.Sub(from) / 2)
			w := waiting(from, to)
			if w == nil || inFault(mid) || held(mid) {
				flush()
				continue
			}
			if cur == nil {
				cur, who = &span{from, to}, w
			} else {
				cur.to = to
			}
			if granted(from, to) {
				flush()
			}
		}
		flush()
	}
}

// expiredDuring reports whether an injected expiry of op's key overlapped
// op (it may have dropped a queued waiter's own state).
func (c *checker) expiredDuring(op Op) bool {
	for _, e := range c.ops {
		if e.Kind == Expire && e.Key == op.Key && !e.Start.After(op.End) && !e.End.Before(op.Start) {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Summary returns one line per violation, or "" if there are none.
func Summary(vs []Violation) string {
	var b strings.Builder
	for _, v := range vs {
		b.WriteString(v.String())
		b.WriteByte('\n')
	}
	return b.String()
}
