package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/backend"
)

// lease is a held lock: our ephemeral node, first in its queue.
type lease struct {
	d      *Driver
	node   string
	token  uint64
	anchor time.Time // when the read that granted the lease was sent

	mu     sync.Mutex
	ttl    time.Duration
	lapse  *time.Timer // deletes the node when the TTL runs out without a refresh
	lapsed bool

	releasing atomic.Bool // our own Release deletes the node: not a loss
	lost      chan struct{}
	lostOnce  sync.Once
	lostErr   error
	stop      context.CancelFunc
}

// newLease starts the lease of node; the read that found it was sent at
// sent and set watch on it.
func (d *Driver) newLease(node string, token uint64, ttl time.Duration, sent time.Time, watch <-chan zk.Event) *lease {
	l := &lease{d: d, node: node, token: token, anchor: sent, ttl: ttl, lost: make(chan struct{})}
	l.lapse = time.AfterFunc(ttl, l.expire)
	ctx, cancel := context.WithCancel(d.ctx)
	l.stop = cancel
	d.bg.Go(func() { l.watchLoss(ctx, watch) })
	return l
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

func (l *lease) Lost() <-chan struct{} { return l.lost }

func (l *lease) LostErr() error { return l.lostErr }

func (l *lease) lose(why string) {
	if l.releasing.Load() {
		return
	}
	l.lostOnce.Do(func() {
		l.lostErr = fmt.Errorf("%w: zookeeper: %s", backend.ErrLeaseLost, why)
		close(l.lost)
	})
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
	l.d.bg.Go(func() { l.d.deleteNode(l.node) }) // after Close the session is gone, and the node with it
}

// Refresh confirms, in one round trip, that our node is still there (the
// request also tells the server our session is alive) and restarts the TTL.
// The check is linearizable, a transaction through the leader.
// While the session is disconnected it fails with ErrUnavailable at once:
// the lease is uncertain until the session is back or known expired.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	l.mu.Lock()
	lapsed := l.lapsed
	l.mu.Unlock()
	if lapsed {
		return 0, fmt.Errorf("%w: zookeeper: the TTL ran out", backend.ErrNotHeld)
	}
	if st := l.d.conn.State(); st != zk.StateHasSession {
		return 0, fmt.Errorf("%w: zookeeper: not connected (%v)", backend.ErrUnavailable, st)
	}
	// A check operation in a multi goes through the leader, so unlike a
	// read (served by whichever server we are connected to, possibly
	// behind) it sees a deletion that has already happened. The node's
	// name is unique (GUID), so existence is ownership.
	err := l.d.do(ctx, func() error {
		res, err := l.d.conn.Multi(&zk.CheckVersionRequest{Path: l.node, Version: -1})
		if err == nil && len(res) == 1 {
			err = res[0].Error
		}
		return err
	})
	switch {
	case errors.Is(err, zk.ErrSessionExpired):
		return 0, fmt.Errorf("%w: zookeeper: session expired", backend.ErrNotHeld)
	case errors.Is(err, zk.ErrNoNode):
		return 0, fmt.Errorf("%w: zookeeper: the lock node is gone", backend.ErrNotHeld)
	case err != nil:
		return 0, unavailable("checking the lock node", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lapsed || !l.lapse.Stop() {
		// The TTL ran out during the check (expire may be waiting
		// for l.mu): the node is being given up.
		return 0, fmt.Errorf("%w: zookeeper: the TTL ran out", backend.ErrNotHeld)
	}
	l.lapse.Reset(ttl)
	l.ttl = ttl
	return ttl, nil
}

// Release deletes our node.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	lapsed := l.lapsed
	l.lapsed = true // no expire from now on
	l.lapse.Stop()
	l.mu.Unlock()
	if lapsed {
		return fmt.Errorf("%w: zookeeper: the TTL ran out", backend.ErrNotHeld)
	}
	l.releasing.Store(true)
	err := l.d.do(ctx, func() error { return l.d.conn.Delete(l.node, -1) })
	switch {
	case err == nil:
		l.stop()
		return nil
	case errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrSessionExpired):
		l.stop()
		return fmt.Errorf("%w: zookeeper: the lock node is gone", backend.ErrNotHeld)
	default:
		// Unknown outcome: make sure the node goes, in the background.
		l.d.abandon(l.node)
		l.stop()
		return unavailable("deleting the lock node", err)
	}
}

// watchLoss watches our node, starting with the watch ev: its deletion by
// anyone but our own Release, or the end of the session, is a loss.
func (l *lease) watchLoss(ctx context.Context, ev <-chan zk.Event) {
	for ctx.Err() == nil {
		if ev == nil {
			var (
				ok  bool
				err error
			)
			err = l.d.do(ctx, func() (err error) {
				_, _, ev, err = l.d.conn.GetW(l.node)
				ok = err == nil
				if errors.Is(err, zk.ErrNoNode) {
					err = nil
				}
				return err
			})
			if done := l.checkWatch(ctx, ok, err); done {
				return
			}
			if ev == nil {
				continue // a failed call: try again
			}
		}
		select {
		case <-ctx.Done():
			return
		case e := <-ev:
			ev = nil
			switch {
			case e.Type == zk.EventNodeDeleted:
				l.lose("the lock node was deleted")
				return
			case e.Type == zk.EventNotWatching && errors.Is(e.Err, zk.ErrSessionExpired):
				l.lose("session expired")
				return
			}
		}
	}
}

// checkWatch handles the outcome of setting the watch: it reports whether
// watching is over (the lease is lost or being stopped).
func (l *lease) checkWatch(ctx context.Context, ok bool, err error) bool {
	switch {
	case ctx.Err() != nil:
		return true
	case errors.Is(err, zk.ErrSessionExpired):
		l.lose("session expired")
		return true
	case err != nil:
		select {
		case <-ctx.Done():
			return true
		case <-time.After(retryPause):
		}
		return false
	case !ok:
		l.lose("the lock node was deleted")
		return true
	}
	return false
}
