package zookeeper

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/backend"
)

// Shared leases (semaphores and read-write locks) share the mutex's queue:
// see "Shared leases" in the package doc for the layout, the grant rule and
// how waiters wait.

// kind is what a lock node asks for: an exclusive lease (the zero kind), a
// reader's lease (shared, permits 0) or a permit of a semaphore of permits
// (shared, permits > 0).
type kind struct {
	shared  bool
	permits int
}

// kindOf is the kind of req.
func kindOf(req backend.Request) kind {
	if !req.Shared {
		return kind{}
	}
	return kind{shared: true, permits: req.Permits}
}

// The tags that name a shared lock node's kind: the node's name is
// protectedPrefix + GUID + tag + "-lock-" + sequence. An exclusive node has
// no tag, so its name is what it always was.
const (
	readTag = "-read"
	semTag  = "-sem"
)

// tag is k's part of a lock node's name.
func (k kind) tag() string {
	switch {
	case !k.shared:
		return ""
	case k.permits == 0:
		return readTag
	}
	return semTag + strconv.Itoa(k.permits)
}

// guidLen is the length of the GUID in a lock node's name (newGUID: 16
// random bytes in hex).
const guidLen = 32

// nodeKind reads the kind of a lock node from its name. A name that is not
// one of ours with a tag (a node of another program's recipe, one planted
// by a client allowed to create nodes) is exclusive: it excludes everyone,
// which is never less safe.
func nodeKind(name string) kind {
	i := strings.LastIndex(name, "-lock-")
	if i < len(protectedPrefix)+guidLen || !strings.HasPrefix(name, protectedPrefix) {
		return kind{}
	}
	switch tag := name[len(protectedPrefix)+guidLen : i]; {
	case tag == readTag:
		return kind{shared: true}
	case strings.HasPrefix(tag, semTag):
		digits := tag[len(semTag):]
		if n, err := strconv.Atoi(digits); err == nil && n > 0 && strconv.Itoa(n) == digits {
			return kind{shared: true, permits: n}
		}
	}
	return kind{}
}

// queued is one lock node of a key's queue, as a listing shows it.
type queued struct {
	name string
	seq  int32
	kind kind
}

// entries parses the lock nodes among kids, a listing of a key's
// directory, and orders them by creation (sequence number). Children that
// are not lock nodes are left out.
func entries(kids []string) []queued {
	q := make([]queued, 0, len(kids))
	for _, k := range kids {
		if s, ok := seq(k); ok {
			q = append(q, queued{name: k, seq: s, kind: nodeKind(k)})
		}
	}
	slices.SortFunc(q, func(a, b queued) int {
		switch {
		case before(a.seq, b.seq):
			return -1
		case before(b.seq, a.seq):
			return 1
		}
		return 0
	})
	return q
}

// grantable reports whether q[i] holds its lease, by the grant rule: an
// exclusive node when nothing is ahead of it; a shared node when no
// exclusive node and no shared node of another Permits is ahead of it,
// and, for a semaphore, fewer than Permits nodes are (whatever they are,
// waiters of other kinds included). Nodes only leave the part of a queue
// ahead of a node, so a node that is grantable stays so; and a node that
// is not keeps every node behind it from being grantable (an exclusive
// node or a shared one of another Permits is ahead of them too, or more
// than Permits nodes are), so the granted nodes are a prefix of the queue.
func grantable(q []queued, i int) bool {
	k := q[i].kind
	if !k.shared {
		return i == 0
	}
	if k.permits > 0 && i >= k.permits {
		return false
	}
	for _, e := range q[:i] {
		if !e.kind.shared || e.kind.permits != k.permits {
			return false
		}
	}
	return true
}

// holders is the number of nodes at the head of q that hold leases: the
// prefix that grantable grants, in one pass (every node ahead of the one
// judged holds, so they are all of the head's kind).
func holders(q []queued) int {
	if len(q) == 0 {
		return 0
	}
	head := q[0].kind
	if !head.shared {
		return 1
	}
	n := 1
	for n < len(q) && q[n].kind == head && (head.permits == 0 || n < head.permits) {
		n++
	}
	return n
}

// turn is what a listing of its queue tells a node.
type turn struct {
	mine    bool // our node is in the listing
	granted bool // ours holds the lease now
	// mismatch: the holders (the head of the queue) are shared leases of
	// another Permits than ours.
	mismatch *backend.PermitsError
	// wait: the nodes to watch (names) when not granted, and how.
	wait []string
	how  watchHow
}

// watchHow is how a waiter watches the nodes it waits for.
type watchHow int

const (
	// watchData: a data watch (GetW) on one node, for its deletion, as
	// the mutex has always watched its predecessor (dlock never writes
	// a lock node; a write by another client fires it too, a spurious
	// wake-up: the waiter looks again).
	watchData watchHow = iota
	// watchGone: the deletion of each of the nodes, through the
	// Driver's shared deletion watches (see watchGone).
	watchGone
)

// judge applies the grant rule to the listing kids for our node me, of
// kind k, and says which nodes to watch if ours is not granted. A waiter
// watches nodes whose deletion can bring its grant, and only deletions:
// no grant needs any action of the node granted, so a waiter that stalls
// (a frozen process, a cut connection) delays no one it is not ahead of,
// and nothing is ever written to a lock node.
//   - An exclusive node watches its immediate predecessor (the mutex's
//     recipe, with its data watch): it holds once every node ahead is
//     gone, so not before that one is; it looks again when it goes.
//   - A reader watches the nearest node ahead that is not a reader (an
//     exclusive node, or a waiter of another Permits), with a data watch:
//     a reader holds once every node ahead is a reader, so while that node
//     is there it cannot, whatever else leaves.
//   - A permit of a semaphore of N watches the deletion of each of the N
//     nodes nearest ahead of it (all of them when fewer are ahead). While
//     they are all there, at least N nodes are ahead of it, or the nodes
//     ahead are the same as at its look: it cannot have been granted in
//     between, so no wake-up is missed however the nodes further ahead
//     leave (the exact rule, not a chain of grants told down the queue).
//     It also watches the nearest exclusive node further ahead, whose
//     deletion may grant shared nodes of another Permits (its mismatch,
//     then reported without waiting for the nodes near it).
//
// A node's deletion thus wakes its successor if exclusive, the readers
// right behind it, and at most N permit waiters (the N behind it), however
// many wait: a herd bounded by N, never by the queue. A permit waiter's
// watches are set once per node per Driver (see watchGone), so waiting
// again costs a request only for the nodes newly among the N nearest.
//
// Mismatch: only the holders count. They are a prefix of the queue, all
// of the head's kind, so a shared request mismatches when the head is a
// shared node of another Permits; a waiter ahead of another Permits is no
// evidence (a request that mismatches is in the queue for a moment before
// it leaves, and one that is granted becomes a holder, seen then).
func judge(kids []string, me string, k kind) turn {
	var t turn
	q := entries(kids)
	i := slices.IndexFunc(q, func(e queued) bool { return e.name == me })
	if i < 0 {
		return t
	}
	t.mine = true
	ahead := q[:i]
	if h := q[0].kind; k.shared && i > 0 && h.shared && h.permits != k.permits {
		t.mismatch = &backend.PermitsError{Asked: k.permits, Held: h.permits}
		return t
	}
	q[i].kind = k // our own kind is what we asked, whatever the name says
	if t.granted = grantable(q, i); t.granted {
		return t
	}
	switch {
	case !k.shared:
		t.wait = []string{ahead[i-1].name}
	case k.permits == 0:
		for j := i - 1; j >= 0 && len(t.wait) == 0; j-- {
			if ahead[j].kind != k {
				t.wait = []string{ahead[j].name}
			}
		}
	default:
		near := max(0, i-k.permits)
		for j := near - 1; j >= 0; j-- {
			if !ahead[j].kind.shared {
				t.wait = append(t.wait, ahead[j].name)
				break
			}
		}
		for _, e := range ahead[near:] {
			t.wait = append(t.wait, e.name)
		}
		t.how = watchGone
	}
	return t
}

// watchTurn sets the watches t asks for (under parent) and returns a
// channel that receives when one fires. ready reports that the node of a
// data watch is gone already (a permit waiter's channel receives at once
// then). stop ends the waiter's interest; call it once done.
func (d *Driver) watchTurn(ctx context.Context, parent string, t turn) (ev <-chan zk.Event, stop func(), ready bool, err error) {
	if t.how == watchGone {
		ev, stop, err = d.watchGone(ctx, parent, t.wait)
		return ev, stop, false, err
	}
	// The mutex's case: one data watch. GetW, not ExistsW: on a missing
	// node ExistsW would leave a watch for its creation, which never
	// comes. ev is read only once the call has returned (not when ctx
	// ended first: it may still be running).
	// The closure writes a variable of its own, never a result of
	// watchTurn: when ctx ends first, d.read returns while the call may
	// still be running (a data race on ev, seen under -race).
	var got <-chan zk.Event
	err = d.read(ctx, true, func() (err error) {
		var ch <-chan zk.Event
		_, _, ch, err = d.conn.GetW(parent + "/" + t.wait[0])
		got = ch
		return err
	})
	nop := func() {}
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil, nop, true, nil
	case err != nil:
		return nil, nop, false, err
	}
	return got, nop, false, nil
}

// goneWatch is the deletion watch of one lock node, shared by the permit
// waiters of the Driver that wait for it: subs are their wake-up channels.
type goneWatch struct {
	subs map[chan zk.Event]struct{}
}

// watchGone watches the deletion of parent's children names for a permit
// waiter, and returns a channel that receives when one of them is deleted
// (or is gone already, or its watch ended: the session expired, the
// Driver closed). The Driver keeps one watch per node (d.gone), set by the
// first waiter that needs it (a child listing of the node, ChildrenW: it
// fires on the node's deletion and not on a write of its data) and ended
// by the session's event callback (goneEvent) when the server reports the
// deletion. Every later waiter, and the same waiter looking again, joins
// it without a request: the client library keeps a channel per watch set
// until the node changes, so setting it at every look would pile channels
// up on a long-held permit. The requests are in flight together. stop
// ends the subscription.
func (d *Driver) watchGone(ctx context.Context, parent string, names []string) (ev <-chan zk.Event, stop func(), err error) {
	wake := make(chan zk.Event, 1)
	ws := make([]*goneWatch, len(names))
	var set []int // the watches this waiter sets
	d.goneMu.Lock()
	for i, name := range names {
		path := parent + "/" + name
		w := d.gone[path]
		if w == nil {
			w = &goneWatch{subs: make(map[chan zk.Event]struct{})}
			d.gone[path] = w
			set = append(set, i)
		}
		w.subs[wake] = struct{}{}
		ws[i] = w
	}
	d.goneMu.Unlock()
	stop = func() {
		d.goneMu.Lock()
		for _, w := range ws {
			delete(w.subs, wake)
		}
		d.goneMu.Unlock()
	}
	errs := make([]error, len(set))
	var wg sync.WaitGroup
	for j, i := range set {
		path := parent + "/" + names[i]
		wg.Add(1)
		if !d.bg.Go(func() {
			defer wg.Done()
			errs[j] = d.read(ctx, true, func() error {
				_, _, _, err := d.conn.ChildrenW(path)
				return err
			})
		}) {
			wg.Done()
			errs[j] = backend.ErrClosed
		}
	}
	wg.Wait()
	for j, i := range set {
		switch e := errs[j]; {
		case e == nil:
		case errors.Is(e, zk.ErrNoNode):
			// Gone already: its subscribers (us among them) look again.
			d.fireGone(parent+"/"+names[i], ws[i])
		default:
			// Not known set: dropped, and its other subscribers look
			// again (and set it themselves).
			d.fireGone(parent+"/"+names[i], ws[i])
			if err == nil {
				err = e
			}
		}
	}
	if err != nil {
		stop()
		return nil, func() {}, err
	}
	return wake, stop, nil
}

// fireGone ends the deletion watch w of path (nil: whichever is
// registered): it leaves the Driver's table and wakes its subscribers.
func (d *Driver) fireGone(path string, w *goneWatch) {
	d.goneMu.Lock()
	defer d.goneMu.Unlock()
	if w == nil {
		w = d.gone[path]
	}
	if w != nil {
		d.fireGoneLocked(path, w)
	}
}

func (d *Driver) fireGoneLocked(path string, w *goneWatch) {
	if d.gone[path] == w {
		delete(d.gone, path)
	}
	for ch := range w.subs {
		select {
		case ch <- zk.Event{Type: zk.EventNodeDeleted, Path: path}:
		default: // woken already
		}
	}
	w.subs = nil // stop's deletes from a nil map are no-ops
}

// goneEvent is the part of the session's event callback that ends the
// deletion watches: a node's deletion, a change of its children (which
// uses the child watch up: no lock node of ours has children, but a
// foreign node in the queue may), a watch the client library ended
// (EventNotWatching: the session expired, or Close), the session's
// expiry. A write of a node's data does not fire a child watch, and is
// ignored. It runs in the client's receive loop, in the order of the
// server's messages.
func (d *Driver) goneEvent(ev zk.Event) {
	switch {
	case ev.Type == zk.EventNodeDeleted, ev.Type == zk.EventNodeChildrenChanged, ev.Type == zk.EventNotWatching:
		d.fireGone(ev.Path, nil)
	case ev.Type == zk.EventSession && ev.State == zk.StateExpired:
		d.goneMu.Lock()
		for path, w := range d.gone {
			d.fireGoneLocked(path, w)
		}
		d.goneMu.Unlock()
	}
}
