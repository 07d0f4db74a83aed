package zookeeper

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"

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
	// behind: nodes queued behind ours are in the listing. A semaphore
	// permit granted with nodes behind it writes its node once (see
	// announce).
	behind bool
	// mismatch: a shared node ahead of ours asked for another Permits.
	mismatch *backend.PermitsError
	// wait: the nodes to watch (names) when not granted, and how.
	wait []string
	how  watchHow
}

// watchHow is how a waiter watches the nodes it waits for.
type watchHow int

const (
	// watchData: a data watch (GetW), for the node's deletion, as the
	// mutex has always watched its predecessor (a write of the node's
	// data fires it too, a spurious wake-up: the waiter looks again).
	watchData watchHow = iota
	// watchGone: a child watch (ChildrenW), which fires on the node's
	// deletion only, never on a write of its data (a holder's announce).
	watchGone
	// watchChange: a data watch for any change of one node: its deletion,
	// or the write with which it announces its grant.
	watchChange
)

// judge applies the grant rule to the listing kids for our node me, of
// kind k, and says which nodes to watch if ours is not granted:
//   - an exclusive node watches its immediate predecessor's deletion (the
//     mutex's recipe, with its data watch);
//   - a reader, the deletion of the nearest exclusive node ahead of it
//     (a data watch too: dlock never writes an exclusive node): only
//     exclusive nodes keep a reader out, and the readers behind one are
//     all granted when it goes;
//   - a permit of a semaphore, when every node ahead holds (exactly
//     Permits of them, or one exclusive node), the deletion of each of
//     them (child watches, which the holders' announces do not fire): it
//     is the first waiter, the next to be granted;
//   - a later permit waiter, its immediate predecessor (a waiter too),
//     for any change: its deletion, or the write with which it announces
//     that it was granted (announce), after which ours may be first.
//
// No node watches anything that does not bring its own turn closer, so a
// release wakes O(1) waiters however many wait (no herd), except that all
// the readers that one release grants wake together.
func judge(kids []string, me string, k kind) turn {
	var t turn
	q := entries(kids)
	i := slices.IndexFunc(q, func(e queued) bool { return e.name == me })
	if i < 0 {
		return t
	}
	t.mine = true
	t.behind = i < len(q)-1
	ahead := q[:i]
	if k.shared {
		for _, e := range ahead {
			if e.kind.shared && e.kind.permits != k.permits {
				t.mismatch = &backend.PermitsError{Asked: k.permits, Held: e.kind.permits}
				return t
			}
		}
	}
	q[i].kind = k // our own kind is what we asked, whatever the name says
	if t.granted = grantable(q, i); t.granted || i == 0 {
		return t
	}
	switch {
	case !k.shared:
		t.wait = []string{ahead[i-1].name}
	case k.permits == 0:
		for j := i - 1; j >= 0; j-- {
			if !ahead[j].kind.shared {
				t.wait = []string{ahead[j].name}
				break
			}
		}
	case holders(ahead) == len(ahead):
		for _, e := range ahead {
			t.wait = append(t.wait, e.name)
		}
		t.how = watchGone
	default:
		t.wait, t.how = []string{ahead[i-1].name}, watchChange
	}
	if len(t.wait) == 0 { // cannot happen: a reader is kept out by an exclusive node only
		t.wait = []string{ahead[i-1].name}
	}
	return t
}

// watchTurn sets the watches t asks for (under parent), all in flight
// together, and returns a channel that receives when one fires. ready
// reports that there is nothing to wait for: a node to watch is gone
// already, or (watchChange) the predecessor has announced its grant since
// the listing, which its data version (> 0) tells. *seen is the version of
// the last announce so taken for a wake-up: data that changes no further
// (a version that a client other than dlock wrote, say) wakes the waiter
// once, not in a loop. stop ends the channel's forwarding; call it once
// done.
func (d *Driver) watchTurn(ctx context.Context, parent string, t turn, seen *string) (ev <-chan zk.Event, stop func(), ready bool, err error) {
	type watched struct {
		ev   <-chan zk.Event
		gone bool
		err  error
	}
	watch := func(name string) watched {
		var (
			ev   <-chan zk.Event
			stat *zk.Stat
		)
		err := d.read(ctx, true, func() (err error) {
			if t.how == watchGone {
				_, stat, ev, err = d.conn.ChildrenW(parent + "/" + name)
			} else {
				_, stat, ev, err = d.conn.GetW(parent + "/" + name)
			}
			return err
		})
		// ev and stat are read only once the call has returned (not
		// when ctx ended first: it may still be running).
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return watched{gone: true}
		case err != nil:
			return watched{err: err}
		}
		w := watched{ev: ev}
		if t.how == watchChange && stat.Version > 0 {
			// Announced: look again, once per version.
			if v := name + "@" + strconv.Itoa(int(stat.Version)); v != *seen {
				*seen = v
				w.gone = true
			}
		}
		return w
	}
	nop := func() {}
	if len(t.wait) == 1 {
		// The mutex's case: one watch, no goroutine.
		w := watch(t.wait[0])
		return w.ev, nop, w.gone, w.err
	}
	res := make([]watched, len(t.wait))
	done := make(chan struct{}, len(t.wait))
	for i, name := range t.wait {
		if !d.bg.Go(func() {
			defer func() { done <- struct{}{} }()
			res[i] = watch(name)
		}) {
			return nil, nop, false, backend.ErrClosed
		}
	}
	for range t.wait {
		<-done
	}
	merged := make(chan zk.Event, 1)
	quit := make(chan struct{})
	for _, w := range res {
		switch {
		case w.err != nil:
			close(quit)
			return nil, nop, false, w.err
		case w.gone:
			ready = true
		}
	}
	if ready {
		close(quit)
		return nil, nop, true, nil
	}
	for _, w := range res {
		if !d.bg.Go(func() {
			select {
			case e := <-w.ev: // an event, or closed (the watch ended)
				select {
				case merged <- e:
				default:
				}
			case <-quit:
			}
		}) {
			close(quit)
			return nil, nop, false, backend.ErrClosed
		}
	}
	return merged, func() { close(quit) }, false, nil
}

// announce writes our node, a semaphore permit just granted, once (its
// data unchanged, a new version) when the listing showed nodes behind it:
// a waiter behind may have listed the queue before the grant, seen ours
// waiting, and watch it for a change (judge). Only then, so an uncontended
// permit costs what a mutex does. Our own loss watch is a child watch,
// which a write does not fire. A write cut by a connection loss is sent
// again (writing the same data twice is harmless).
func (d *Driver) announce(ctx context.Context, queued bool, l *lease, k kind, t turn, data []byte) error {
	if k.permits == 0 || !t.behind {
		return nil
	}
	err := d.read(ctx, queued, func() error {
		_, err := d.conn.Set(l.node, data, -1)
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return errVanished
	}
	if err != nil {
		return unavailable("announcing the grant", err)
	}
	return nil
}

// errVanished: our lock node is gone while we acquire (the session
// expired, or a client allowed to deleted it).
var errVanished = errors.New("the lock node vanished (session expired?)")
