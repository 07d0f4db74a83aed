package check_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
)

// hist builds histories by hand, at times given in milliseconds from its
// start.
type hist struct {
	h *check.History
}

func newHist() *hist { return &hist{check.NewHistory()} }

func (h *hist) t(ms int) time.Time { return h.h.Begin().Add(time.Duration(ms) * time.Millisecond) }

// grant records a granted acquire invoked at from, returned at to, valid
// until deadline, and returns its ID.
func (h *hist) grant(client, key string, from, to, deadline int, tok dlock.Token) int {
	return h.h.Add(check.Op{Kind: check.Acquire, Client: client, Key: key, Wait: true, Start: h.t(from), End: h.t(to),
		Token: tok, TTL: time.Duration(deadline-to) * time.Millisecond, Deadline: h.t(deadline)})
}

func (h *hist) release(lease, at int) {
	h.h.Add(check.Op{Kind: check.Release, Lease: lease, Start: h.t(at), End: h.t(at + 1)})
}

func (h *hist) write(lease int, tok dlock.Token, at int, read int64, seq int, accepted bool) {
	h.h.Add(check.Op{Kind: check.Write, Key: "k", Lease: lease, Token: tok, Start: h.t(at), End: h.t(at),
		Read: read, Wrote: read + 1, Seq: seq, Accepted: accepted})
}

func props(vs []check.Violation) string {
	var ps []string
	for _, v := range vs {
		ps = append(ps, string(v.Property))
	}
	return strings.Join(ps, ",")
}

// want checks that exactly the properties listed are violated, once each.
func want(t *testing.T, h *hist, o check.Options, wantProps ...check.Property) []check.Violation {
	t.Helper()
	vs := check.Check(h.h, o)
	var w []string
	for _, p := range wantProps {
		w = append(w, string(p))
	}
	if got := props(vs); got != strings.Join(w, ",") {
		t.Fatalf("violations %q, want %q:\n%s", got, strings.Join(w, ","), check.Summary(vs))
	}
	return vs
}

func TestCleanHistory(t *testing.T) {
	h := newHist()
	a := h.grant("a", "k", 0, 10, 1000, 5)
	h.write(a, 5, 20, 0, 1, true)
	h.release(a, 30)
	b := h.grant("b", "k", 5, 40, 1040, 6) // waited for a
	h.write(b, 6, 50, 1, 2, true)
	h.release(b, 60)
	c := h.grant("c", "k", 100, 110, 200, 9) // no release: valid until its deadline
	h.write(c, 9, 120, 2, 3, true)
	d := h.grant("d", "k", 150, 210, 300, 10) // granted once c's deadline passed
	h.write(c, 9, 220, 3, 4, false)           // c writes late: refused
	h.write(d, 10, 230, 3, 5, true)
	h.release(d, 240)
	want(t, h, check.Options{Progress: time.Second})
}

func TestMutualExclusionCaught(t *testing.T) {
	h := newHist()
	a := h.grant("a", "k", 0, 10, 1000, 1)
	b := h.grant("b", "k", 20, 30, 1030, 2) // a's lease is still valid
	h.release(a, 500)
	h.release(b, 600)
	vs := want(t, h, check.Options{}, check.MutualExclusion)
	if vs[0].A.ID != a || vs[0].B.ID != b || !strings.Contains(vs[0].Detail, "granted +10ms") || !strings.Contains(vs[0].Detail, "granted +30ms") {
		t.Errorf("the report does not name both operations and their times: %v", vs[0])
	}
}

// Two holders valid at once for only 200 µs are a violation, whatever ended
// the first lease: the checker allows no tolerance, and the report gives the
// overlap at its real size. A grant exactly at the first lease's end is no
// violation.
func TestSubMillisecondOverlapCaught(t *testing.T) {
	const overlap = 200 * time.Microsecond
	for _, end := range []string{"deadline", "release", "lost"} {
		for _, gap := range []time.Duration{-overlap, 0} {
			t.Run(fmt.Sprintf("%s/gap=%v", end, gap), func(t *testing.T) {
				h := newHist()
				deadline := 1000
				if end == "deadline" {
					deadline = 100
				}
				a := h.grant("a", "k", 0, 10, deadline, 1)
				switch end {
				case "release":
					h.release(a, 100)
				case "lost":
					h.h.Add(check.Op{Kind: check.Lost, Lease: a, Start: h.t(100), End: h.t(100), Err: dlock.ErrLeaseLost})
				}
				granted := h.t(100).Add(gap)
				b := h.h.Add(check.Op{Kind: check.Acquire, Client: "b", Key: "k", Wait: true, Start: h.t(50), End: granted,
					Token: 2, TTL: time.Second, Deadline: granted.Add(time.Second)})
				h.release(b, 500)
				if gap == 0 {
					want(t, h, check.Options{})
					return
				}
				vs := want(t, h, check.Options{}, check.MutualExclusion)
				if vs[0].A.ID != a || vs[0].B.ID != b || !strings.Contains(vs[0].Detail, "both valid for "+overlap.String()) {
					t.Errorf("the report does not name both leases and the %v overlap: %v", overlap, vs[0])
				}
			})
		}
	}
}

// The ends of a lease's validity: release invoked, Done fired, an injected
// expiry, its Deadline. A grant after any of them is no violation; the same
// grant before it is.
func TestValidityEnds(t *testing.T) {
	for _, end := range []string{"release", "lost", "expire", "deadline"} {
		for _, after := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/after=%v", end, after), func(t *testing.T) {
				h := newHist()
				deadline := 1000
				if end == "deadline" {
					deadline = 100
				}
				a := h.grant("a", "k", 0, 10, deadline, 1)
				switch end {
				case "release":
					h.release(a, 100)
				case "lost":
					h.h.Add(check.Op{Kind: check.Lost, Lease: a, Start: h.t(100), End: h.t(100), Err: dlock.ErrLeaseLost})
				case "expire":
					h.h.Expire("k", 0, h.t(100), h.t(120))
				}
				grantAt := 150
				if !after {
					grantAt = 90
				}
				h.grant("b", "k", 50, grantAt, 2000, 2)
				if after {
					want(t, h, check.Options{})
				} else {
					want(t, h, check.Options{}, check.MutualExclusion)
				}
			})
		}
	}
}

// A refreshed lease is valid until the latest Deadline seen.
func TestRefreshedDeadlineExtends(t *testing.T) {
	h := newHist()
	a := h.grant("a", "k", 0, 10, 100, 1)
	h.write(a, 1, 90, 0, 1, true)
	h.h.Add(check.Op{Kind: check.Write, Key: "k", Lease: a, Token: 1, Start: h.t(95), End: h.t(95), Deadline: h.t(300), Read: 1, Wrote: 2, Seq: 2, Accepted: true})
	h.grant("b", "k", 50, 200, 2000, 2) // a was refreshed to 300
	want(t, h, check.Options{}, check.MutualExclusion)
}

// A Refresh to a shorter TTL shortens the lease: a contender granted after
// the new Deadline, while the holder's Done fires late, overlaps nothing.
// Without the Refresh recorded, the longer Deadline seen at the grant
// still holds (the holder may have relied on it); a watchdog's refresh
// seen after the Refresh extends the lease again.
func TestRefreshShortens(t *testing.T) {
	for _, c := range []struct {
		name                           string
		recorded, noDeadline, extended bool
		want                           []check.Property
	}{
		{"refresh recorded", true, false, false, nil},
		{"refresh not recorded", false, false, false, []check.Property{check.MutualExclusion}},
		{"extended after the refresh", true, false, true, []check.Property{check.MutualExclusion}},
		// A Refresh without a Deadline sets nothing: the grant's holds.
		{"refresh recorded without its Deadline", true, true, false, []check.Property{check.MutualExclusion}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHist()
			a := h.grant("a", "k", 0, 10, 1000, 1)
			if c.recorded {
				op := check.Op{Kind: check.Refresh, Key: "k", Lease: a, Start: h.t(100), End: h.t(101), Deadline: h.t(300)}
				if c.noDeadline {
					op.Deadline = time.Time{}
				}
				h.h.Add(op)
			}
			if c.extended {
				h.h.Add(check.Op{Kind: check.Write, Key: "r", Lease: a, Token: 1, Start: h.t(250), End: h.t(250), Deadline: h.t(500), Read: 0, Wrote: 1, Seq: 1, Accepted: true})
			}
			lostDeadline := 300
			if c.extended {
				lostDeadline = 500
			}
			h.h.Add(check.Op{Kind: check.Lost, Key: "k", Lease: a, Start: h.t(350), End: h.t(350), Deadline: h.t(lostDeadline)})
			b := h.grant("b", "k", 200, 310, 2000, 2)
			h.release(b, 1500)
			want(t, h, check.Options{}, c.want...)
		})
	}
}

// A lease that was never valid (granted past its Deadline, or cut before
// its grant returned) overlaps nothing.
func TestNeverValidOverlapsNothing(t *testing.T) {
	h := newHist()
	a := h.grant("a", "k", 0, 10, 1000, 1)
	h.grant("b", "k", 5, 30, 20, 2) // returned past its Deadline
	h.release(a, 50)
	want(t, h, check.Options{})
}

// An expiry that names the token it dropped cuts that lease only: two
// waiters granted after it, both valid at once, are a violation. Without
// the token, either may have been the one dropped (granted before the
// drop), so the checker cannot tell.
func TestExpireByToken(t *testing.T) {
	for _, tok := range []dlock.Token{4, 0} {
		h := newHist()
		h.grant("x", "k", 0, 1, 90, 4) // the holder the expiry drops
		h.h.Expire("k", tok, h.t(100), h.t(110))
		a := h.grant("a", "k", 2, 200, 2000, 5)
		b := h.grant("b", "k", 50, 210, 2010, 6)
		h.release(a, 1000)
		h.release(b, 1000)
		if tok != 0 {
			want(t, h, check.Options{Progress: time.Second}, check.MutualExclusion)
		} else {
			want(t, h, check.Options{Progress: time.Second})
		}
		spans := check.Validity(h.h)
		if got := spans[1].Valid(); got != (tok != 0) {
			t.Errorf("token %d: lease a Valid() = %v", tok, got)
		}
	}
}

// A lease cut by an expiry of unknown token may still have been granted
// after the drop and held the key: a waiter behind it is not starved.
func TestExpiryAmbiguousLeaseHoldsForProgress(t *testing.T) {
	h := newHist()
	h.h.Expire("k", 0, h.t(100), h.t(110))
	a := h.grant("a", "k", 0, 200, 30000, 5)
	h.release(a, 15000)
	h.grant("b", "k", 50, 15010, 17000, 6)
	want(t, h, check.Options{Progress: 10 * time.Second})
}

// A lease refreshed (by its watchdog) and then lost is valid until its
// Done, found from the Deadline recorded with the loss.
func TestLostCarriesRefreshedDeadline(t *testing.T) {
	h := newHist()
	a := h.grant("a", "k", 0, 10, 2000, 5)
	h.h.Add(check.Op{Kind: check.Lost, Lease: a, Start: h.t(5000), End: h.t(5000), Deadline: h.t(5000)})
	b := h.grant("b", "k", 2900, 3000, 5000, 6)
	h.release(b, 4000)
	want(t, h, check.Options{}, check.MutualExclusion)
}

func TestKeysAreSeparate(t *testing.T) {
	h := newHist()
	h.grant("a", "k1", 0, 10, 1000, 1)
	h.grant("b", "k2", 0, 10, 1000, 1)
	want(t, h, check.Options{})
}

func TestTokenOrderCaught(t *testing.T) {
	for _, tok := range []dlock.Token{5, 4} { // equal, lower
		h := newHist()
		a := h.grant("a", "k", 0, 10, 1000, 5)
		h.release(a, 20)
		h.grant("b", "k", 30, 40, 1000, tok)
		want(t, h, check.Options{}, check.TokenOrder)
	}
	// Leases valid one after the other: the later one needs the larger
	// token, even though the acquires overlapped.
	h0 := newHist()
	a0 := h0.grant("a", "k", 0, 10, 1000, 5)
	h0.release(a0, 100)
	h0.grant("b", "k", 5, 150, 1000, 4)
	want(t, h0, check.Options{}, check.TokenOrder)

	// Overlapping acquires may be granted in either order: b's grant may
	// have come first (and run out before a's: b returned a lease
	// already past its Deadline).
	h := newHist()
	a := h.grant("a", "k", 0, 50, 60, 5)
	h.release(a, 55)
	h.grant("b", "k", 10, 70, 65, 4)
	want(t, h, check.Options{})
}

func TestLostUpdateCaught(t *testing.T) {
	h := newHist()
	a := h.grant("a", "k", 0, 10, 100, 1)
	b := h.grant("b", "k", 200, 210, 300, 2)
	h.write(a, 1, 20, 0, 1, true)
	h.write(b, 2, 220, 0, 2, true) // read 0, but a had written 1
	want(t, h, check.Options{}, check.LostUpdate)
}

func TestStaleWriteCaught(t *testing.T) {
	for _, tok := range []dlock.Token{2, 1} { // equal, lower
		h := newHist()
		a := h.grant("a", "k", 0, 10, 100, 2)
		b := h.grant("b", "k", 200, 210, 300, 3)
		h.write(b, 3, 220, 0, 1, true)
		// A register that wrongly accepts the write of another lease with
		// a token not above the last one.
		h.h.Add(check.Op{Kind: check.Write, Key: "k", Lease: a, Token: tok, Start: h.t(230), End: h.t(230), Read: 1, Wrote: 2, Seq: 2, Accepted: true})
		h.release(b, 240)
		want(t, h, check.Options{}, check.StaleWrite)
	}
}

func TestRegisterRefusesStaleToken(t *testing.T) {
	h := check.NewHistory()
	r := check.NewRegister(h, "k")
	if v, ok := r.Read(5); !ok || v != 0 {
		t.Fatalf("Read(5) = %d, %v", v, ok)
	}
	if !r.Write("a", 1, 5, time.Time{}, 0) {
		t.Fatal("write with the highest token refused")
	}
	if _, ok := r.Read(4); ok {
		t.Fatal("Read with a lower token accepted")
	}
	if r.Write("b", 2, 4, time.Time{}, 0) {
		t.Fatal("Write with a lower token accepted")
	}
	if vs := check.Check(h, check.Options{}); len(vs) != 0 {
		t.Fatalf("violations: %s", check.Summary(vs))
	}
}

func TestLivenessCaught(t *testing.T) {
	// b waits from 0 to 5000; a holds until 100: nothing granted for 4.9s.
	h := newHist()
	a := h.grant("a", "k", 0, 1, 100, 1)
	h.release(a, 100)
	h.h.Add(check.Op{Kind: check.Acquire, Client: "b", Key: "k", Wait: true, Start: h.t(2), End: h.t(5000), Err: context.DeadlineExceeded})
	want(t, h, check.Options{Progress: time.Second}, check.Liveness)

	// The same inside a declared fault window is no violation.
	h.h.Fault("server down", h.t(50), h.t(4500))
	want(t, h, check.Options{Progress: time.Second})

	// A holder that dies keeps its key until its lease runs out; a grant
	// within the bound after that is no violation, a later one is.
	for _, grantAt := range []int{2500, 4000} {
		h := newHist()
		h.grant("a", "k", 0, 1, 2000, 1) // never released
		h.grant("b", "k", 2, grantAt, 9000, 2)
		if grantAt < 3000 {
			want(t, h, check.Options{Progress: time.Second})
		} else {
			want(t, h, check.Options{Progress: time.Second}, check.Liveness)
		}
	}

	// An acquire that fails as unavailable outside a fault window.
	h = newHist()
	h.h.Add(check.Op{Kind: check.Acquire, Client: "b", Key: "k", Wait: true, Start: h.t(0), End: h.t(10), Err: fmt.Errorf("acquire: %w", dlock.ErrUnavailable)})
	want(t, h, check.Options{Progress: time.Second}, check.Liveness)
	h.h.Fault("server down", h.t(5), h.t(20))
	want(t, h, check.Options{Progress: time.Second})

	// An acquire whose own deadline cut its last attempt short says both
	// ErrUnavailable and context.DeadlineExceeded: a timeout, judged by
	// the progress rule, not a failure of the backend.
	h = newHist()
	h.h.Add(check.Op{Kind: check.Acquire, Client: "b", Key: "k", Wait: true, Start: h.t(0), End: h.t(10),
		Err: fmt.Errorf("%w; last backend error: %w", context.DeadlineExceeded, dlock.ErrUnavailable)})
	want(t, h, check.Options{Progress: time.Second})

	// One cut by a timeout of the client's own (Redlock's per-node
	// timeout, a network i/o timeout: a loaded machine, no fault) is a
	// timeout too, judged by the progress rule; the same failure without
	// Timeout() true is not.
	for _, timeout := range []bool{true, false} {
		h := newHist()
		h.h.Add(check.Op{Kind: check.Acquire, Client: "b", Key: "k", Wait: true, Start: h.t(0), End: h.t(10),
			Err: fmt.Errorf("%w: 4 of 5 nodes did not answer: %w", dlock.ErrUnavailable, timeoutErr(timeout))})
		if timeout {
			want(t, h, check.Options{Progress: time.Second})
		} else {
			want(t, h, check.Options{Progress: time.Second}, check.Liveness)
		}
	}

	// An injected expiry of the key during the acquire excuses it (the
	// waiter's own state may have been dropped); one of another key does
	// not.
	for _, key := range []string{"k", "other"} {
		h := newHist()
		h.h.Add(check.Op{Kind: check.Acquire, Client: "b", Key: "k", Wait: true, Start: h.t(0), End: h.t(10), Err: fmt.Errorf("acquire: %w", dlock.ErrUnavailable)})
		h.h.Expire(key, 0, h.t(4), h.t(6))
		if key == "k" {
			want(t, h, check.Options{Progress: time.Second})
		} else {
			want(t, h, check.Options{Progress: time.Second}, check.Liveness)
		}
	}
}

// timeoutErr is a node's error whose Timeout method reports t.
type timeoutErr bool

func (e timeoutErr) Error() string { return "no answer within the per-node timeout" }
func (e timeoutErr) Timeout() bool { return bool(e) }

// shared records a granted shared acquire, as grant does, of a permit of
// permits (0: a reader).
func (h *hist) shared(client, key string, from, to, deadline int, tok dlock.Token, permits int) int {
	return h.h.Add(check.Op{Kind: check.Acquire, Client: client, Key: key, Wait: true, Start: h.t(from), End: h.t(to),
		Token: tok, TTL: time.Duration(deadline-to) * time.Millisecond, Deadline: h.t(deadline), Shared: true, Permits: permits})
}

func TestSharedLeases(t *testing.T) {
	t.Run("within the permits", func(t *testing.T) {
		h := newHist()
		a := h.shared("a", "k", 0, 10, 1000, 5, 2)
		b := h.shared("b", "k", 0, 20, 1000, 6, 2)
		h.release(a, 30)
		c := h.shared("c", "k", 25, 40, 1000, 7, 2) // after a's release: two at once
		h.release(b, 50)
		h.release(c, 60)
		r1 := h.shared("r1", "k", 70, 80, 1000, 8, 0) // readers: unbounded
		r2 := h.shared("r2", "k", 70, 81, 1000, 9, 0)
		r3 := h.shared("r3", "k", 70, 82, 1000, 10, 0)
		for _, r := range []int{r1, r2, r3} {
			h.release(r, 90)
		}
		w := h.grant("w", "k", 85, 100, 1000, 11) // the writer after the readers
		h.release(w, 110)
		want(t, h, check.Options{Progress: time.Second})
	})
	t.Run("one permit too many", func(t *testing.T) {
		h := newHist()
		h.shared("a", "k", 0, 10, 1000, 5, 2)
		h.shared("b", "k", 0, 20, 1000, 6, 2)
		h.shared("c", "k", 0, 30, 1000, 7, 2)
		vs := want(t, h, check.Options{}, check.PermitCount)
		if !strings.Contains(vs[0].Detail, "3 shared leases valid") {
			t.Errorf("detail %q does not count the leases", vs[0].Detail)
		}
	})
	t.Run("a reader with the writer", func(t *testing.T) {
		h := newHist()
		h.shared("r", "k", 0, 10, 1000, 5, 0)
		h.grant("w", "k", 0, 20, 1000, 6)
		want(t, h, check.Options{}, check.MutualExclusion)
	})
	t.Run("shared replies in either order", func(t *testing.T) {
		// b's grant came first on the server (token 5) but its reply
		// came after a's whole lease: no token order is broken.
		h := newHist()
		a := h.shared("a", "k", 0, 10, 1000, 6, 2)
		h.release(a, 20)
		h.shared("b", "k", 0, 30, 1000, 5, 2)
		want(t, h, check.Options{})
	})
	t.Run("a writer after a reader with a smaller token", func(t *testing.T) {
		h := newHist()
		r := h.shared("r", "k", 0, 10, 1000, 6, 0)
		h.release(r, 20)
		h.grant("w", "k", 0, 30, 1000, 5)
		want(t, h, check.Options{}, check.TokenOrder)
	})
}
