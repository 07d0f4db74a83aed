package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.ChangeWatcher = (*Driver)(nil)

// errWatchEnded: the watch's channel closed before the server created it.
var errWatchEnded = errors.New("the watch ended before the server created it")

// WatchChanges implements backend.ChangeWatcher with one etcd watch on
// key's directory, the range where its holder's and its waiters' keys live
// (see Inspect). The watch is made without a start revision, so that it is
// in etcd's synced group and a change reaches it within a round trip, and
// WatchChanges returns once the server has created it (its created
// notification): every change committed after that is reported. ctx and
// the request timeout bound only that; the watch then lasts until stop, or
// until it ends by itself.
//
// A change is the creation or the deletion of a key in the directory: a
// grant or a waiter joining the queue, a release, an expiry, a waiter
// leaving it. The rewrites of the holder's key by a Refresh to another TTL
// (which moves the key to a new lease; its holder does not change) are not
// reported. The channel holds one pending signal; a send never blocks.
//
// The client resumes a watch whose connection broke by itself, from the
// revision after the last one it delivered, so no change is missed then,
// only delayed. The channel is closed when the watch ends by itself: the
// server cancelled it (a member without a leader: the watch requires one,
// as the Driver's own watches do; a compaction past the revision the
// client resumed from), the client was closed, or the Driver was; the
// caller then reads the state again and watches anew. A member that froze
// cancels nothing and keeps the stream open: so the watch asks the member
// for a progress notification every request timeout, and ends (the
// channel is closed) when one asked for a request timeout earlier has not
// come, nor anything else since: a watch on a frozen member ends within two
// request timeouts. The watch shares the client's watch stream with
// the Driver's own watches; it costs one watcher on the server and one
// goroutine here until stop, which cancels the watch and waits for that
// goroutine. A bad key is refused before any I/O (backend.ErrInvalidKey).
// Errors wrap backend.ErrUnavailable (and ctx.Err() when ctx ended first),
// or backend.ErrClosed when Close came first.
func (d *Driver) WatchChanges(ctx context.Context, key string) (changed <-chan struct{}, stop func(), err error) {
	const doing = "watching the lock's queue"
	if err := backend.ValidateKey(key); err != nil {
		return nil, nil, err
	}
	if err := d.ValidateKey(key); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("%w: etcd: %s: %w", backend.ErrUnavailable, doing, err)
	}
	if f := d.fault.Load(); f != nil {
		if err := (*f)(doing, 0); err != nil {
			return nil, nil, unavailable(doing, err)
		}
	}
	dir := d.dir(key)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(d.ctx))
	ch := make(chan struct{}, 1)
	created := make(chan error, 1)
	done := make(chan struct{})
	started := d.bg.Go(func() {
		defer close(done)
		defer close(ch)
		defer cancel()
		wch := d.client.Watch(wctx, dir, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		// A member that froze keeps the stream open and cancels
		// nothing: ask for a progress notification every request
		// timeout, and end the watch when the one asked for last time
		// has not come (nor anything else since).
		probe := time.NewTicker(d.timeout)
		defer probe.Stop()
		first, asked, answered := true, false, false
		for {
			var (
				wr clientv3.WatchResponse
				ok bool
			)
			select {
			case wr, ok = <-wch:
			case <-probe.C:
				switch {
				case first:
					// Not created yet: WatchChanges times that.
				case asked && !answered:
					return // the member did not answer within a request timeout
				default:
					asked, answered = true, false
					pctx, pcancel := context.WithTimeout(wctx, d.timeout)
					err := d.client.RequestProgress(pctx)
					pcancel()
					if err != nil && wctx.Err() == nil {
						return // the stream is stuck
					}
				}
				continue
			}
			if !ok {
				break
			}
			answered = true
			if first {
				first = false
				if err := wr.Err(); err != nil || !wr.Created {
					if err == nil {
						err = errWatchEnded
					}
					created <- err
					return
				}
				created <- nil
				continue
			}
			if wr.Err() != nil || wr.Canceled {
				return // the watch ended by itself
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.IsCreate() {
					select {
					case ch <- struct{}{}:
					default:
					}
					break
				}
			}
		}
		if first {
			created <- errWatchEnded
		}
	})
	if !started {
		cancel()
		return nil, nil, fmt.Errorf("%w: etcd: %s", backend.ErrClosed, doing)
	}
	t := time.NewTimer(d.timeout)
	defer t.Stop()
	select {
	case err = <-created:
		if err != nil {
			err = unavailable(doing, err)
		}
	case <-ctx.Done():
		err = fmt.Errorf("%w: etcd: %s: %w", backend.ErrUnavailable, doing, ctx.Err())
	case <-t.C:
		err = fmt.Errorf("%w: etcd: %s: no answer within the request timeout (%v)", backend.ErrUnavailable, doing, d.timeout)
	}
	if err != nil {
		cancel()
		<-done
		if d.ctx.Err() != nil { // Close ended the watch before it was made
			return nil, nil, fmt.Errorf("%w: etcd: %s", backend.ErrClosed, doing)
		}
		return nil, nil, err
	}
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}, nil
}
