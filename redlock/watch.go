package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redishub"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
)

// minWatchTimeout is the least time Watch gives the nodes to confirm a
// subscription (the first one opens a pub/sub connection: a dial and a
// handshake, more than one round trip).
const minWatchTimeout = 500 * time.Millisecond

// watchTimeout bounds how long Watch waits for a majority of the nodes to
// confirm their subscriptions.
func (d *Driver) watchTimeout() time.Duration { return max(4*d.nodeTimeout, minWatchTimeout) }

// Watch (backend.Waiter) subscribes to key's release channel on every node,
// through one pub/sub connection per node shared by all the Driver's
// watchers (internal/redisx/redishub, as the redis backend does), and returns once
// a majority of the nodes has confirmed the subscription; the other nodes'
// subscriptions join when they are confirmed. A release published by any
// node wakes the watcher: the holder's majority shares a node with the
// watched majority, and the release script publishes on every node where a
// waiter's attempt found the lock held. A node that fails or misses the
// attempt can cost the wake-up; the Locker's fallback poll (RetryMax) then
// ends the wait. Watch fails with ErrUnavailable when no majority confirms
// within 4 × NodeTimeout (at least 500ms); a node that refuses the
// SUBSCRIBE (its user may not use the channel, NOPERM) counts as failed,
// with the server's reply, as soon as a check has read it (see the
// package documentation, Permissions).
func (d *Driver) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	channel := d.keys(key)[0] + redisscript.ReleaseSuffix
	w := &watch{d: d, wake: make(chan struct{}, 1), quit: make(chan struct{})}
	wctx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	type result struct {
		node int
		err  error
	}
	results := make(chan result, len(d.nodes))
	for i, h := range d.hubs {
		started := d.watchBG.Go(func() {
			sctx, cancel := context.WithTimeout(wctx, d.watchTimeout())
			defer cancel()
			wake, stop, err := h.Watch(sctx, channel)
			if err == nil && !w.add(wake, stop) {
				err = errWatchStopped
			}
			results <- result{i, err}
		})
		if !started {
			results <- result{i, backend.ErrClosed}
		}
	}
	// Wait for a majority, at most the watch timeout: a node's
	// subscription can take longer to fail than to time out (go-redis
	// re-dials a frozen node's pub/sub connection with its own timeouts),
	// so the nodes still on their way are not waited for; they join the
	// watch, or end, in the background.
	timer := time.NewTimer(d.watchTimeout())
	defer timer.Stop()
	var ok, failed int
	var errs []error
	for ok < d.quorum && failed <= len(d.nodes)-d.quorum {
		select {
		case r := <-results:
			if r.err == nil {
				ok++
				continue
			}
			failed++
			if errors.Is(r.err, backend.ErrClosed) {
				w.stop()
				return nil, nil, backend.ErrClosed
			}
			errs = append(errs, fmt.Errorf("node %d: %w", r.node, ownTimeout(ctx, r.err, "the watch timeout "+d.watchTimeout().String())))
		case <-timer.C:
			errs = append(errs, fmt.Errorf("%d nodes did not confirm within %v", len(d.nodes)-ok-failed, d.watchTimeout()))
			failed = len(d.nodes) - ok
		case <-ctx.Done():
			w.stop()
			return nil, nil, fmt.Errorf("%w: redlock: subscribing to %q: %w", backend.ErrUnavailable, channel, ctx.Err())
		}
	}
	if ok < d.quorum {
		w.stop()
		return nil, nil, fmt.Errorf("%w: redlock: subscribing to %q: confirmed by %d of %d nodes (%d needed): %w",
			backend.ErrUnavailable, channel, ok, len(d.nodes), d.quorum, errors.Join(errs...))
	}
	return w.wake, w.stop, nil
}

// errWatchStopped: a node's subscription was confirmed after its watch
// was stopped (and it was stopped at once).
var errWatchStopped = errors.New("watch stopped")

// watch is one Watch over all nodes: the nodes' wake-ups are forwarded to
// wake.
type watch struct {
	d      *Driver
	wake   chan struct{}
	quit   chan struct{} // closed by stop
	cancel context.CancelFunc

	mu      sync.Mutex
	stopped bool
	stops   []func()
}

// add forwards a node's wake-ups to w.wake until w is stopped or the node's
// channel is closed (the Driver is closed). It reports false, having ended
// the node's subscription, if w is stopped already.
func (w *watch) add(wake <-chan struct{}, stop func()) bool {
	w.mu.Lock()
	if w.stopped || !w.d.watchBG.Go(func() { w.forward(wake) }) {
		w.mu.Unlock()
		stop()
		return false
	}
	w.stops = append(w.stops, stop)
	w.mu.Unlock()
	return true
}

func (w *watch) forward(wake <-chan struct{}) {
	for {
		select {
		case <-w.quit:
			return
		case _, open := <-wake:
			select {
			case w.wake <- struct{}{}:
			default:
			}
			if !open {
				return
			}
		}
	}
}

// stop ends the subscriptions made so far and those still on their way.
func (w *watch) stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	stops := w.stops
	w.stops = nil
	w.mu.Unlock()
	w.cancel()
	close(w.quit)
	// Unsubscribing is I/O that can wait on a frozen node (see Watch):
	// it is done in the background.
	for _, stop := range stops {
		if !w.d.watchBG.Go(stop) {
			stop()
		}
	}
}

// closeWatches closes the pub/sub connections, which ends the watches that
// remain (their wake channels receive), and waits for their goroutines, at
// most closeWatchTimeout: a frozen node's connection can hold go-redis's
// PubSub lock for many seconds (the PubSub re-dials and re-subscribes under
// it, with the client's dial and read timeouts), and whatever waits for the
// lock then ends in the background, once go-redis gives up.
func (d *Driver) closeWatches() {
	d.watchBG.Close()
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, h := range d.hubs {
			wg.Go(h.Close)
		}
		wg.Wait()
		d.watchBG.Wait()
		close(done)
	}()
	t := time.NewTimer(closeWatchTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// closeWatchTimeout bounds how long Close waits for the pub/sub connections
// to close.
const closeWatchTimeout = 2 * time.Second

// newHubs makes the Driver's pub/sub hubs, one per node; each opens its
// connection on the first Watch.
func (d *Driver) newHubs() {
	barrier := d.prefix + "barrier:" + newValue()[:16] + ":"
	d.hubs = make([]*redishub.Hub, len(d.nodes))
	for i, c := range d.nodes {
		d.hubs[i] = redishub.New(c, barrier, fmt.Sprintf("redlock: node %d", i))
	}
}
