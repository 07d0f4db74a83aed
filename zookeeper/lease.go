package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/backend"
)

// lease is a held lock: our ephemeral node, first in its queue. It is in
// the driver's table (d.leases) from just before the read that grants it
// until its Release, its loss or the end of its TTL, so that the session's
// event loop can tell it of its node's deletion.
type lease struct {
	d      *Driver
	node   string
	token  uint64
	anchor time.Time // when the read that granted the lease was sent

	mu     sync.Mutex
	ttl    time.Duration
	lapse  *time.Timer // deletes the node when the TTL runs out without a refresh
	lapsed bool

	// Under d.leaseMu.
	watchGen uint64      // connection on which our own read set the watch on node (0: none known)
	armedAt  uint64      // d.probes when that read was answered
	lossErr  error       // why the lease is lost, once known
	notify   func(error) // the dlock layer's NotifyLoss callback, until called
}

// Anchor is when the read that granted the lease was sent (an acquire may
// have queued for long before it).
func (l *lease) Anchor() time.Time { return l.anchor }

func (l *lease) Token() uint64 { return l.token }

func (l *lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// NotifyLoss registers f, called (by the driver's one dispatcher goroutine)
// when the node is deleted by anyone but our Release, or the session
// expires; at once if that is known already.
func (l *lease) NotifyLoss(f func(err error)) {
	l.d.leaseMu.Lock()
	err := l.lossErr
	if err == nil {
		l.notify = f
	}
	l.d.leaseMu.Unlock()
	if err != nil {
		f(err)
	}
}

// expire runs when the TTL ran out without a refresh: the holder gives the
// lock up itself, as a server-side TTL would (the session would keep the
// node alive while the process lives).
func (l *lease) expire() {
	l.mu.Lock()
	if l.lapsed {
		l.mu.Unlock()
		return
	}
	l.lapsed = true
	l.mu.Unlock()
	l.d.leaseMu.Lock()
	l.d.loseLocked(l, "the TTL ran out without a refresh")
	l.d.leaseMu.Unlock()
	l.d.bg.Go(func() { l.d.deleteNode(l.node) }) // after Close the session is gone, and the node with it
}

// Refresh is [Driver.RefreshBatch] of this lease alone.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	r := []backend.RefreshRequest{{Lease: l, TTL: ttl}}
	l.d.RefreshBatch(ctx, r)
	return r[0].Granted, r[0].Err
}

// Release deletes our node. A node already known deleted (the session
// expired, someone deleted it, the TTL ran out) is ErrNotHeld, without I/O.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	lapsed := l.lapsed
	l.lapsed = true // no expire from now on
	l.lapse.Stop()
	l.mu.Unlock()
	l.d.leaseMu.Lock()
	lost := l.lossErr
	l.d.untrackLocked(l) // our own deletion is not a loss
	l.d.leaseMu.Unlock()
	switch {
	case lapsed:
		return fmt.Errorf("%w: zookeeper: the TTL ran out", backend.ErrNotHeld)
	case lost != nil:
		return fmt.Errorf("%w: %w", backend.ErrNotHeld, lost)
	}
	err := l.d.do(ctx, func() error { return l.d.conn.Delete(l.node, -1) })
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrSessionExpired):
		return fmt.Errorf("%w: zookeeper: the lock node is gone", backend.ErrNotHeld)
	default:
		// Unknown outcome: make sure the node goes, in the background.
		l.d.abandon(l.node)
		return unavailable("deleting the lock node", err)
	}
}

// The loss watches. There is no goroutine per lease: each lease's node is
// watched by the read that granted it (a child watch, see arm), and the
// session's event callback (onEvent) marks the lease lost when the server
// reports the node's deletion or the session's expiry. One dispatcher
// goroutine per Driver calls the dlock layer's callbacks, so that the
// client library's receive loop never waits for them.

// lossNote is one loss to report.
type lossNote struct {
	f   func(error)
	err error
}

// track puts l in the table of leases whose node deletion is a loss.
func (d *Driver) track(l *lease) {
	d.leaseMu.Lock()
	d.leases[l.node] = l
	d.leaseMu.Unlock()
}

// untrack takes l out of the table: what happens to its node is no longer
// a loss.
func (d *Driver) untrack(l *lease) {
	d.leaseMu.Lock()
	d.untrackLocked(l)
	d.leaseMu.Unlock()
}

func (d *Driver) untrackLocked(l *lease) {
	if d.leases[l.node] == l {
		delete(d.leases, l.node)
	}
	l.notify = nil
}

// loseLocked marks l lost (once) and queues its callback for the
// dispatcher; l leaves the table. d.leaseMu is held.
func (d *Driver) loseLocked(l *lease, why string) {
	if d.leases[l.node] == l {
		delete(d.leases, l.node)
	}
	if l.lossErr != nil {
		return
	}
	l.lossErr = fmt.Errorf("%w: zookeeper: %s", backend.ErrLeaseLost, why)
	if l.notify != nil {
		d.pending = append(d.pending, lossNote{l.notify, l.lossErr})
		l.notify = nil
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
}

// onEvent is the part of the session's event callback that concerns
// leases. It runs in the client's receive loop, in the order of the
// server's messages: a node's deletion is marked before any later reply is
// delivered (ZooKeeper sends a watch event before the reply to a request
// that follows the change).
func (d *Driver) onEvent(ev zk.Event) {
	d.leaseMu.Lock()
	defer d.leaseMu.Unlock()
	switch {
	case ev.Type == zk.EventNodeDeleted:
		if l := d.leases[ev.Path]; l != nil {
			d.loseLocked(l, "the lock node was deleted")
		}
	case ev.Type == zk.EventSession && ev.State == zk.StateHasSession:
		d.gen++ // a new connection: the watches our reads set are not known in force on it
	case ev.Type == zk.EventSession && ev.State == zk.StateExpired:
		d.gen++
		for _, l := range d.leases {
			d.loseLocked(l, "session expired")
		}
	}
}

// dispatch calls the loss callbacks queued by loseLocked, until Close.
func (d *Driver) dispatch() {
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-d.wake:
		}
		d.leaseMu.Lock()
		notes := d.pending
		d.pending = nil
		d.leaseMu.Unlock()
		for _, n := range notes {
			if d.ctx.Err() != nil {
				return
			}
			n.f(n.err)
		}
	}
}

// arm reads l's node with a watch on it. A reply proves that the node
// existed, owned by our session, as of the state of the server that
// answered; it returns the node's czxid and when the request was sent.
// The read is a listing of the node's children (none: it is ephemeral),
// whose reply carries the node's Stat: a child watch fires on the node's
// deletion as a data watch does, but not on a write of its data, so a
// write by another client allowed to (dlock writes no lock node) does not
// use it up.
// If the connection did not change during the call, the watch is known in
// force on it from then on: l.watchGen and l.armedAt record it.
func (d *Driver) arm(l *lease) (czxid int64, sent time.Time, err error) {
	d.leaseMu.Lock()
	gen := d.gen
	d.leaseMu.Unlock()
	sent = time.Now()
	_, stat, _, err := d.conn.ChildrenW(l.node)
	if err != nil {
		return 0, sent, err
	}
	if sid := d.conn.SessionID(); stat.EphemeralOwner != sid {
		// Created in a session that has ended: the server is deleting it.
		return 0, sent, fmt.Errorf("%w: the lock node belongs to session %#x, not ours (%#x)", zk.ErrNoNode, stat.EphemeralOwner, sid)
	}
	d.leaseMu.Lock()
	if d.gen == gen && d.conn.State() == zk.StateHasSession {
		l.watchGen, l.armedAt = gen, d.probes
	}
	d.leaseMu.Unlock()
	return stat.Czxid, sent, nil
}

// probe is one session check shared by the refreshes that joined it before
// it was sent: a sync request, which the server we are connected to passes
// through the leader (it is not a transaction: nothing is logged and the
// zxid does not move).
type probe struct {
	done chan struct{}
	id   uint64 // d.probes when sent
	gen  uint64 // the connection it was sent on
	err  error
}

// joinProbe returns the next probe to be sent, starting the sender if it
// is idle: at most one probe is in flight, and every refresh that comes
// while it is joins the next one.
func (d *Driver) joinProbe() *probe {
	d.probeMu.Lock()
	defer d.probeMu.Unlock()
	if d.nextProbe == nil {
		d.nextProbe = &probe{done: make(chan struct{})}
	}
	p := d.nextProbe
	if !d.probing {
		d.nextProbe = nil
		d.probing = true
		if !d.bg.Go(func() { d.runProbes(p) }) {
			d.probing = false
			p.err = backend.ErrClosed
			close(p.done)
		}
	}
	return p
}

// runProbes sends p, then the probes joined meanwhile, one at a time.
func (d *Driver) runProbes(p *probe) {
	for p != nil {
		p.err = d.sendProbe(p)
		close(p.done)
		d.probeMu.Lock()
		p, d.nextProbe = d.nextProbe, nil
		d.probing = p != nil
		d.probeMu.Unlock()
	}
}

// sendProbe sends the sync request of p. A reply on the connection it was
// sent on (none in between) proves that the session was alive when the
// leader ordered the sync, at or after the send: an expired session's
// closing (and the deletion of its nodes) is ordered before the sync, and
// the server closes the connection of an expired session before replying.
// Every node deletion the leader had committed before the sync was sent to
// us as a watch event before the reply, for each node whose watch was in
// force on that connection before the sync was sent. One exception, when
// we are connected to the leader itself: ZooKeeper answers a sync of the
// leader's own client at once, and the leader applies a commit (and sends
// its watch events) only after sending it to the followers, so a deletion
// by another client (one allowed to delete our node: outside the lock's
// guarantees, see doc.go) may reach us shortly after the reply. Our
// session's end is not such a deletion: the leader marks a session closing
// before it proposes its end, and then refuses the sync (session expired).
func (d *Driver) sendProbe(p *probe) error {
	if st := d.conn.State(); st != zk.StateHasSession {
		return fmt.Errorf("%w: zookeeper: not connected (%v)", backend.ErrUnavailable, st)
	}
	d.leaseMu.Lock()
	d.probes++
	p.id, p.gen = d.probes, d.gen
	d.leaseMu.Unlock()
	_, err := d.conn.Sync(d.prefix)
	switch {
	case errors.Is(err, zk.ErrSessionExpired):
		return fmt.Errorf("%w: zookeeper: session expired", backend.ErrNotHeld)
	case err != nil:
		return unavailable("checking the session", err)
	}
	d.leaseMu.Lock()
	same := d.gen == p.gen
	d.leaseMu.Unlock()
	if !same {
		return fmt.Errorf("%w: zookeeper: the connection changed during the session check", backend.ErrUnavailable)
	}
	return nil
}

// rearmConcurrency bounds the reads of a batch refresh after a reconnect.
const rearmConcurrency = 32

// RefreshBatch refreshes leases of this driver. They share the session, so
// one probe (a sync, not a transaction) proves it alive for all of them;
// each lease whose node's watch is known in force on the connection since
// before the probe was sent is proven still ours by the absence of a
// deletion event before the probe's reply. The others (the first refresh
// after a reconnect) are read again, with a watch, after the probe: one
// read each, in parallel. No request is a write.
func (d *Driver) RefreshBatch(ctx context.Context, reqs []backend.RefreshRequest) {
	var todo []int
	for i := range reqs {
		l, ok := reqs[i].Lease.(*lease)
		switch {
		case !ok || l.d != d:
			reqs[i].Err = fmt.Errorf("%w: zookeeper: not a lease of this driver", backend.ErrNotHeld)
		case l.isLapsed():
			reqs[i].Err = fmt.Errorf("%w: zookeeper: the TTL ran out", backend.ErrNotHeld)
		default:
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return
	}
	fail := func(idx []int, err error) {
		for _, i := range idx {
			reqs[i].Err = err
		}
	}
	if err := ctx.Err(); err != nil {
		fail(todo, fmt.Errorf("%w: zookeeper: %w", backend.ErrUnavailable, err))
		return
	}
	p := d.joinProbe()
	select {
	case <-p.done:
	case <-ctx.Done():
		fail(todo, fmt.Errorf("%w: zookeeper: checking the session: %w", backend.ErrUnavailable, ctx.Err()))
		return
	}
	if p.err != nil {
		fail(todo, p.err)
		return
	}
	var ok, rearm []int
	d.leaseMu.Lock()
	for _, i := range todo {
		l := reqs[i].Lease.(*lease)
		switch {
		case l.lossErr != nil:
			reqs[i].Err = fmt.Errorf("%w: %w", backend.ErrNotHeld, l.lossErr)
		case l.watchGen == p.gen && l.armedAt < p.id:
			ok = append(ok, i)
		default:
			rearm = append(rearm, i)
		}
	}
	d.leaseMu.Unlock()
	if len(rearm) > 0 {
		ok = append(ok, d.rearm(ctx, p, reqs, rearm)...)
	}
	for _, i := range ok {
		l := reqs[i].Lease.(*lease)
		d.leaseMu.Lock()
		lost := l.lossErr
		d.leaseMu.Unlock()
		if lost != nil {
			reqs[i].Err = fmt.Errorf("%w: %w", backend.ErrNotHeld, lost)
			continue
		}
		if l.restart(reqs[i].TTL) {
			reqs[i].Granted = reqs[i].TTL
		} else {
			// The TTL ran out during the check (expire may be
			// waiting for l.mu): the node is being given up.
			reqs[i].Err = fmt.Errorf("%w: zookeeper: the TTL ran out", backend.ErrNotHeld)
		}
	}
}

// rearm reads the nodes of reqs[idx] again, after probe p, on p's
// connection: a read sent after the sync reflects the leader's state at the
// sync or later. It sets the errors and returns the indexes of the leases
// proven still ours.
func (d *Driver) rearm(ctx context.Context, p *probe, reqs []backend.RefreshRequest, idx []int) []int {
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(idx))
	next := make(chan int, len(idx))
	for _, i := range idx {
		next <- i
	}
	close(next)
	for w := 0; w < min(len(idx), rearmConcurrency); w++ {
		if !d.bg.Go(func() {
			for i := range next {
				l := reqs[i].Lease.(*lease)
				_, _, err := d.arm(l)
				if err == nil {
					d.leaseMu.Lock()
					if l.watchGen != p.gen {
						err = fmt.Errorf("%w: zookeeper: the connection changed during the check", backend.ErrUnavailable)
					}
					d.leaseMu.Unlock()
				}
				results <- result{i, err}
			}
		}) {
			break
		}
	}
	var ok []int
	answered := make(map[int]bool, len(idx))
	for range idx {
		var r result
		select {
		case r = <-results:
		case <-ctx.Done():
			for _, i := range idx {
				if !answered[i] {
					reqs[i].Err = fmt.Errorf("%w: zookeeper: reading the lock node: %w", backend.ErrUnavailable, ctx.Err())
				}
			}
			return ok
		case <-d.ctx.Done():
			for _, i := range idx {
				if !answered[i] {
					reqs[i].Err = backend.ErrClosed
				}
			}
			return ok
		}
		answered[r.i] = true
		l := reqs[r.i].Lease.(*lease)
		switch {
		case r.err == nil:
			ok = append(ok, r.i)
		case errors.Is(r.err, zk.ErrNoNode):
			d.leaseMu.Lock()
			d.loseLocked(l, "the lock node is gone")
			err := l.lossErr
			d.leaseMu.Unlock()
			reqs[r.i].Err = fmt.Errorf("%w: %w", backend.ErrNotHeld, err)
		case errors.Is(r.err, zk.ErrSessionExpired):
			reqs[r.i].Err = fmt.Errorf("%w: zookeeper: session expired", backend.ErrNotHeld)
		case errors.Is(r.err, backend.ErrUnavailable):
			reqs[r.i].Err = r.err
		default:
			reqs[r.i].Err = unavailable("reading the lock node", r.err)
		}
	}
	return ok
}

// isLapsed reports that the TTL ran out (or Release began).
func (l *lease) isLapsed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lapsed
}

// restart restarts the TTL at ttl from now; false if it ran out already.
func (l *lease) restart(ttl time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lapsed || !l.lapse.Stop() {
		return false
	}
	l.lapse.Reset(ttl)
	l.ttl = ttl
	return true
}
