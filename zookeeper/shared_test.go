package zookeeper_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/zookeeper"
)

// node is a lock node's name as the driver makes it: GUID n, the kind's
// tag, sequence number seq.
func node(n int, shared bool, permits int, seq int32) string {
	return fmt.Sprintf("_c_%032x%s-lock-%010d", n, zookeeper.NodeTag(shared, permits), seq)
}

// req is one queued node of a test queue.
type req struct {
	shared  bool
	permits int
}

var (
	excl   = req{}
	reader = req{shared: true}
)

func sem(n int) req { return req{shared: true, permits: n} }

// queue names the nodes of rs, in this order, from sequence number first.
func queue(first int32, rs ...req) []string {
	var kids []string
	for i, r := range rs {
		kids = append(kids, node(i, r.shared, r.permits, first+int32(i)))
	}
	return kids
}

func TestNodeTag(t *testing.T) {
	for _, c := range []struct {
		r    req
		want string
	}{{excl, ""}, {reader, "-read"}, {sem(1), "-sem1"}, {sem(40), "-sem40"}} {
		if got := zookeeper.NodeTag(c.r.shared, c.r.permits); got != c.want {
			t.Errorf("tag of %+v = %q, want %q", c.r, got, c.want)
		}
	}
}

// TestJudge checks the grant rule and what a waiter watches on fixed
// queues: the last node of each queue is ours.
func TestJudge(t *testing.T) {
	for _, c := range []struct {
		name    string
		q       []req
		granted bool
		wait    []int // indexes of the nodes watched
		gone    bool  // through the shared deletion watches (a permit waiter)
		held    int   // a mismatch: the Permits held (-1: none)
	}{
		{"exclusive alone", []req{excl}, true, nil, false, -1},
		{"exclusive behind exclusive", []req{excl, excl, excl}, false, []int{1}, false, -1},
		{"exclusive behind readers", []req{reader, reader, excl}, false, []int{1}, false, -1},
		{"exclusive behind permits", []req{sem(2), sem(2), excl}, false, []int{1}, false, -1},
		{"readers together", []req{reader, reader, reader}, true, nil, false, -1},
		{"reader behind held writer", []req{excl, reader, reader}, false, []int{0}, false, -1},
		{"reader behind waiting writer", []req{reader, excl, reader, reader}, false, []int{1}, false, -1},
		{"reader behind two writers", []req{excl, excl, reader}, false, []int{1}, false, -1},
		{"reader behind a waiter of another size", []req{reader, sem(2), reader, reader}, false, []int{1}, false, -1},
		{"permit free", []req{sem(3), sem(3), sem(3)}, true, nil, false, -1},
		{"first permit waiter", []req{sem(2), sem(2), sem(2)}, false, []int{0, 1}, true, -1},
		{"later permit waiter", []req{sem(2), sem(2), sem(2), sem(2)}, false, []int{1, 2}, true, -1},
		{"permit far back", []req{sem(2), sem(2), sem(2), sem(2), sem(2), sem(2)}, false, []int{3, 4}, true, -1},
		{"permit behind held writer", []req{excl, sem(2)}, false, []int{0}, true, -1},
		{"permit behind writer's waiter", []req{excl, sem(2), sem(2)}, false, []int{0, 1}, true, -1},
		{"permit behind waiting writer", []req{sem(3), excl, sem(3)}, false, []int{0, 1}, true, -1},
		{"permits count waiting writers", []req{sem(3), excl, sem(3), sem(3)}, false, []int{0, 1, 2}, true, -1},
		{"permit far behind a writer", []req{excl, sem(2), sem(2), sem(2), sem(2)}, false, []int{0, 2, 3}, true, -1},
		{"nearest writer further ahead", []req{excl, sem(2), excl, sem(2), sem(2), sem(2)}, false, []int{2, 3, 4}, true, -1},
		{"permits mismatch", []req{sem(2), sem(3)}, false, nil, false, 2},
		{"permit behind readers", []req{reader, sem(2)}, false, nil, false, 0},
		{"reader behind permits", []req{sem(2), reader}, false, nil, false, 2},
		{"mismatch with the holders, waiters between", []req{sem(2), sem(2), sem(2), sem(5)}, false, nil, false, 2},
		{"mismatch with holders ahead of a writer", []req{sem(2), excl, sem(3)}, false, nil, false, 2},
		// A waiter ahead is no evidence of a mismatch: it leaves, or is
		// granted and seen then.
		{"waiter of another size ahead", []req{sem(2), sem(3), sem(2)}, false, []int{0, 1}, true, -1},
		{"waiter of another size behind a writer", []req{excl, sem(2), sem(3)}, false, []int{0, 1}, true, -1},
		{"reader behind a writer and permits", []req{excl, sem(2), reader}, false, []int{1}, false, -1},
		{"writer ahead is no mismatch", []req{excl, sem(4)}, false, []int{0}, true, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, first := range []int32{1, math.MaxInt32 - 1} { // and across the counter's wrap
				kids := queue(first, c.q...)
				last := c.q[len(c.q)-1]
				rand.Shuffle(len(kids), func(i, j int) { kids[i], kids[j] = kids[j], kids[i] })
				me := node(len(c.q)-1, last.shared, last.permits, first+int32(len(c.q)-1))
				granted, wait, gone, mismatch := zookeeper.Judge(kids, me, last.shared, last.permits)
				if c.held >= 0 {
					var pe *backend.PermitsError
					if !errors.As(mismatch, &pe) || pe.Asked != last.permits || pe.Held != c.held || !errors.Is(mismatch, backend.ErrInvalidConfig) {
						t.Errorf("first %d: mismatch %v, want a PermitsError asked %d held %d", first, mismatch, last.permits, c.held)
					}
					continue
				}
				var want []string
				for _, i := range c.wait {
					want = append(want, node(i, c.q[i].shared, c.q[i].permits, first+int32(i)))
				}
				if granted != c.granted || !slices.Equal(wait, want) || gone != c.gone || mismatch != nil {
					t.Errorf("first %d: granted %v, wait %v, gone %v, mismatch %v; want %v, %v, %v, none",
						first, granted, wait, gone, mismatch, c.granted, want, c.gone)
				}
			}
		})
	}
}

// TestJudgeForeignNode: a node that is not one of ours with a tag (another
// recipe's, or planted) is exclusive.
func TestJudgeForeignNode(t *testing.T) {
	me := node(1, true, 0, 2)
	for _, foreign := range []string{"_c_0-lock-0000000001", "x-lock-0000000001", "_c_" + fmt.Sprintf("%032x", 9) + "-sem0-lock-0000000001",
		"_c_" + fmt.Sprintf("%032x", 9) + "-sem07-lock-0000000001", "_c_" + fmt.Sprintf("%032x", 9) + "-readx-lock-0000000001"} {
		granted, wait, _, mismatch := zookeeper.Judge([]string{foreign, me}, me, true, 0)
		if granted || !slices.Equal(wait, []string{foreign}) || mismatch != nil {
			t.Errorf("reader behind %q: granted %v, wait %v, mismatch %v; want it kept out, watching that node", foreign, granted, wait, mismatch)
		}
	}
}

// TestJudgeInvariant judges every node of random queues of exclusive nodes
// and shared nodes (mostly of one kind, now and then of two), and checks
// that the granted nodes are a prefix (grants come in creation order, so
// czxids increase) holding either one exclusive lease or shared ones of one
// kind, at most Permits of them, that Inspect counts them so, that every
// waiter watches nodes ahead of it, and that no wake-up is missed: with the
// nodes a waiter watches still there, no departure of any others grants it
// (a waiter is granted by deletions alone, never by another's action).
// Seen red with a permit waiter watching only its predecessor.
func TestJudgeInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	kinds := []req{reader, sem(1), sem(2), sem(3), sem(5)}
	for range 5000 {
		shared, other := kinds[r.IntN(5)], kinds[r.IntN(5)]
		mixed := r.IntN(4) == 0
		n := 1 + r.IntN(9)
		rs := make([]req, n)
		for i := range rs {
			switch {
			case r.IntN(3) == 0:
				rs[i] = excl
			case mixed && r.IntN(2) == 0:
				rs[i] = other
			default:
				rs[i] = shared
			}
		}
		first := int32(r.Uint32())
		kids := queue(first, rs...)
		granted := 0
		for i, rq := range rs {
			g, wait, _, mismatch := zookeeper.Judge(kids, kids[i], rq.shared, rq.permits)
			if mismatch != nil {
				if !mixed && i > 0 {
					t.Fatalf("queue %v: node %d: mismatch %v with one shared kind", rs, i, mismatch)
				}
				if g || i == 0 || rs[0] == rq || !rs[0].shared {
					t.Fatalf("queue %v: node %d: mismatch %v, granted %v, but the head is %+v", rs, i, mismatch, g, rs[0])
				}
				continue
			}
			if g != (i == granted) && g {
				t.Fatalf("queue %v: node %d granted after a waiter: the holders are not a prefix", rs, i)
			}
			if g {
				granted++
				continue
			}
			if len(wait) == 0 {
				t.Fatalf("queue %v: node %d waits for nothing", rs, i)
			}
			for _, w := range wait {
				if j := slices.Index(kids, w); j < 0 || j >= i {
					t.Fatalf("queue %v: node %d watches %q, not a node ahead of it", rs, i, w)
				}
			}
			// Any others leave (random subsets, the node's own kept).
			for range 8 {
				rest := slices.DeleteFunc(slices.Clone(kids), func(k string) bool {
					return k != kids[i] && !slices.Contains(wait, k) && r.IntN(2) == 0
				})
				if g2, _, _, _ := zookeeper.Judge(rest, kids[i], rq.shared, rq.permits); g2 {
					t.Fatalf("queue %v: node %d watches %v, yet granted once only others left (%d of %d nodes remain): a missed wake-up",
						rs, i, wait, len(rest), len(kids))
				}
			}
		}
		if h := zookeeper.Holders(kids); h != granted {
			t.Fatalf("queue %v: Holders (Inspect's count) = %d, but %d nodes are granted", rs, h, granted)
		}
		held := rs[:granted]
		switch {
		case granted == 0:
			t.Fatalf("queue %v: nothing granted", rs)
		case !held[0].shared && granted != 1:
			t.Fatalf("queue %v: %d granted with an exclusive node", rs, granted)
		case held[0].shared && slices.ContainsFunc(held, func(h req) bool { return h != held[0] }):
			t.Fatalf("queue %v: nodes of several kinds granted together", rs)
		case held[0].shared && held[0].permits > 0 && granted > held[0].permits:
			t.Fatalf("queue %v: %d permits granted of %d", rs, granted, held[0].permits)
		}
	}
}
