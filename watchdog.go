package dlock

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
)

// The watchdog refreshes a Locker's auto-refreshed leases: one goroutine per
// Locker, whatever the number of leases, keeps them in a heap by due time
// and refreshes the ones that come due together in one batch, through the
// driver's backend.BatchRefresher where it has one (one pipeline on Redis,
// one keepalive stream on etcd, one read on ZooKeeper), else through each
// lease's Refresh, a bounded number at a time.
const (
	// maxBatch is the most leases refreshed in one batch.
	maxBatch = 1000
	// maxBatches is the most batches in flight at once.
	maxBatches = 8
	// maxFallback is the most Refresh calls in flight per batch on a
	// driver without backend.BatchRefresher.
	maxFallback = 16
	// earlyShare: a lease is refreshed with a batch that runs up to this
	// share of its refresh interval before it is due, so that leases due
	// at nearby times share a round trip.
	earlyShare = 10
)

// watchdog is a Locker's refresher of auto-refreshed leases.
type watchdog struct {
	l       *Locker
	mu      sync.Mutex
	q       wdQueue       // entries waiting for their due time, under mu
	kick    chan struct{} // wakes the loop when an entry is added
	running bool          // the loop goroutine has started, under mu
	sem     chan struct{} // one token per batch in flight
}

// wdEntry is one auto-refreshed lease in the watchdog.
type wdEntry struct {
	le       *Lease
	ttl      time.Duration // asked at each refresh (less near maxUntil)
	floor    time.Duration // the least TTL the backend was seen to grant
	maxUntil time.Time     // MaxHold: never extended past it
	interval time.Duration // ttl/3
	// Under watchdog.mu:
	due     time.Time
	idx     int      // in the heap; -1 when not in it
	batch   *wdBatch // the batch it is in, while one is in flight
	stopped bool     // the lease ended, or is being released
}

// wdBatch is a batch of refreshes in flight.
type wdBatch struct {
	ctx     context.Context
	cancel  context.CancelFunc
	started time.Time
	// patience is how long a Release of one of its leases waits for the
	// batch before cancelling it: half the shortest refresh interval in
	// it, at most maxPatience.
	patience time.Duration
	timer    *time.Timer // cancels the batch when a Release's patience runs out
}

// maxPatience bounds how long a Release waits behind a batch of background
// refreshes with its lease in it, before it cancels the batch.
const maxPatience = time.Second

// add schedules e's first refresh, for a lease whose deadline is deadline.
// l.mu is held and the Locker is open.
func (w *watchdog) add(e *wdEntry, deadline time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e.due = dueAfter(time.Now(), e.interval, deadline)
	heap.Push(&w.q, e)
	if !w.running {
		w.running = true
		w.kick = make(chan struct{}, 1)
		w.sem = make(chan struct{}, maxBatches)
		w.l.bg.Add(1)
		go w.loop()
	}
	w.wake()
}

// wake tells the loop to look at the heap again. w.mu is held.
func (w *watchdog) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// stop takes e out of the watchdog: no refresh of it starts from now on.
// With release (a Release or Close is about to wait for e's lease), a batch
// in flight with e in it is cancelled once it has run for its patience (the
// others in that batch are then refreshed again at once), so that a Release
// waits behind a normal batch, not behind one that hangs. (Cancelling at
// once would starve the other leases when many are released one after
// another: every release would cancel the batch of the others.) Without
// release (the lease ended: lost, or found past its deadline by the batch
// itself) nobody waits, and the batch runs on for the others.
func (w *watchdog) stop(e *wdEntry, release bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !e.stopped {
		e.stopped = true
		if e.idx >= 0 {
			heap.Remove(&w.q, e.idx)
		}
	}
	if b := e.batch; release && b != nil && b.timer == nil {
		b.timer = time.AfterFunc(b.patience-time.Since(b.started), b.cancel)
	}
}

// dueAfter is when a lease refreshed (or granted) at now, with its deadline
// at deadline, is next refreshed: interval (a third of the TTL asked) from
// now, unless that would leave less than interval before the deadline (the
// backend granted less than asked, or the refresh's round trip ate into
// it); then after a third of the time left, so that a grant shorter than
// asked is refreshed in time too, and twice more before it runs out.
func dueAfter(now time.Time, interval time.Duration, deadline time.Time) time.Time {
	left := deadline.Sub(now)
	if left < 2*interval {
		return now.Add(max(left/3, 0))
	}
	return now.Add(interval)
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// reschedule brings e's next refresh forward to what its lease's new
// deadline (after a Refresh by hand) calls for, if that is sooner than
// planned. An entry in a batch in flight is left to the batch, which
// plans its next refresh when it ends.
func (w *watchdog) reschedule(e *wdEntry, deadline time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.stopped || e.idx < 0 {
		return
	}
	if due := dueAfter(time.Now(), e.interval, deadline); due.Before(e.due) {
		e.due = due
		heap.Fix(&w.q, e.idx)
		w.wake()
	}
}

// requeue schedules e's next refresh at due, unless it was stopped.
func (w *watchdog) requeue(e *wdEntry, due time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e.batch = nil
	if e.stopped {
		return
	}
	e.due = due
	heap.Push(&w.q, e)
	w.wake()
}

// drop forgets e: its lease ended, or reached MaxHold.
func (w *watchdog) drop(e *wdEntry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e.batch = nil
	e.stopped = true
}

// loop takes the entries that come due, in batches, until the Locker is
// closed.
func (w *watchdog) loop() {
	defer w.l.bg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	closing := w.l.closing.Done()
	for {
		w.mu.Lock()
		now := time.Now()
		var batch []*wdEntry
		for len(w.q) > 0 && len(batch) < maxBatch {
			e := w.q[0]
			if e.due.Sub(now) > e.interval/earlyShare {
				break
			}
			heap.Pop(&w.q)
			batch = append(batch, e)
		}
		next := time.Duration(-1)
		if len(batch) == 0 && len(w.q) > 0 {
			e := w.q[0]
			next = e.due.Sub(now) - e.interval/earlyShare
		}
		var b *wdBatch
		if len(batch) > 0 {
			b = &wdBatch{started: now, patience: maxPatience}
			b.ctx, b.cancel = context.WithCancel(w.l.closing)
			for _, e := range batch {
				e.batch = b
				b.patience = min(b.patience, e.interval/2)
			}
		}
		w.mu.Unlock()

		if b != nil {
			select {
			case w.sem <- struct{}{}:
			case <-closing:
				b.cancel()
				return
			}
			w.l.bg.Add(1)
			go func() {
				defer w.l.bg.Done()
				defer func() { <-w.sem }()
				w.run(b, batch)
			}()
			continue
		}
		var tc <-chan time.Time
		if next >= 0 {
			timer.Reset(next)
			tc = timer.C
		}
		select {
		case <-closing:
			return
		case <-w.kick:
		case <-tc:
		}
	}
}

// run refreshes one batch.
func (w *watchdog) run(b *wdBatch, batch []*wdEntry) {
	defer func() {
		w.mu.Lock()
		if b.timer != nil {
			b.timer.Stop()
		}
		w.mu.Unlock()
		b.cancel()
	}()
	l := w.l
	reqs := make([]backend.RefreshRequest, 0, len(batch))
	entries := make([]*wdEntry, 0, len(batch))
	var latest time.Time
	for _, e := range batch {
		le := e.le
		if !le.opMu.TryLock() {
			// A Refresh or Release call is under way: look again later,
			// and before the Deadline asks for it (a Refresh by hand to
			// a shorter TTL finds the entry out of the heap, so its
			// reschedule cannot bring it forward).
			now := time.Now()
			w.requeue(e, earliest(now.Add(e.interval/3), dueAfter(now, e.interval, le.Deadline())))
			continue
		}
		if le.Err() != nil {
			le.opMu.Unlock()
			w.drop(e)
			continue
		}
		next, ok := l.watchdogTTL(e.ttl, time.Until(e.maxUntil), e.floor)
		if !ok {
			// MaxHold reached: let the lease run out.
			le.opMu.Unlock()
			w.drop(e)
			continue
		}
		le.shortenFor(time.Now(), next) // near MaxHold, next is shorter
		if d := le.Deadline(); d.After(latest) {
			latest = d
		}
		reqs = append(reqs, backend.RefreshRequest{Lease: le.bl, TTL: next})
		entries = append(entries, e)
	}
	if len(reqs) == 0 {
		return
	}
	// A refresh that cannot finish before its lease's deadline is of no
	// use: the batch ends at the latest deadline in it (not the earliest:
	// one lease near its end must not cut the others' refreshes short; a
	// lease whose deadline passes meanwhile ends, and what its refresh
	// extended is given back). Release and Close do not wait that long:
	// see stop and the closing context.
	ctx, cancel := context.WithDeadline(b.ctx, latest)
	start := time.Now()
	refreshAll(ctx, l.drv, reqs)
	cancel()
	for i, e := range entries {
		le, r := e.le, &reqs[i]
		err := le.settle(ctx, start, r.TTL, r.Granted, r.Err)
		le.opMu.Unlock()
		if l.opts.Observer != nil {
			granted := r.Granted
			if err != nil {
				granted = 0
			}
			le.observeRefresh(b.ctx, true, start, r.TTL, granted, err)
		}
		switch {
		case err == nil:
			w.requeue(e, dueAfter(time.Now(), e.interval, le.Deadline()))
		case errors.Is(err, ErrNotHeld) || l.closing.Err() != nil:
			w.drop(e)
		case b.ctx.Err() != nil:
			// Cancelled by the Release of another lease in the batch,
			// after its patience: try again at once.
			w.requeue(e, time.Now())
		default:
			l.log.Warn("dlock: background refresh failed; retrying", "key", le.key, "err", err)
			w.requeue(e, time.Now().Add(e.interval/3))
		}
	}
}

// refreshAll refreshes reqs through d's BatchRefresher, or else through
// each lease's Refresh, maxFallback at a time.
func refreshAll(ctx context.Context, d backend.Driver, reqs []backend.RefreshRequest) {
	if br, ok := d.(backend.BatchRefresher); ok {
		br.RefreshBatch(ctx, reqs)
		return
	}
	sem := make(chan struct{}, maxFallback)
	var wg sync.WaitGroup
	for i := range reqs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r := &reqs[i]
			r.Granted, r.Err = r.Lease.Refresh(ctx, r.TTL)
		})
	}
	wg.Wait()
}

// wdQueue is a min-heap of entries by due time.
type wdQueue []*wdEntry

func (q wdQueue) Len() int           { return len(q) }
func (q wdQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q wdQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].idx, q[j].idx = i, j
}
func (q *wdQueue) Push(x any) {
	e := x.(*wdEntry)
	e.idx = len(*q)
	*q = append(*q, e)
}
func (q *wdQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	e.idx = -1
	return e
}
