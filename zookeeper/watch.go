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

var _ backend.ChangeWatcher = (*Driver)(nil)

// WatchChanges implements backend.ChangeWatcher with a child watch on key's
// directory (the container node its lock nodes queue under): every lock
// node created or deleted there (a grant, a release, an expiry, a waiter
// joining or leaving) fires it. The watch is armed before WatchChanges
// returns, and after each event it is armed again by a new listing of the
// children, and only then does the channel receive: a change that came
// between the event and the new watch is in that listing, so a caller that
// reads the state after the receive sees it, and every later change fires
// the new watch. Each event gives one receive, whatever it was (a spurious
// one is possible, for instance when the directory is created).
//
// When nobody has locked key yet (or the server has reaped its idle
// directory), there is no directory to watch, and the watch never creates
// one (it only reads: what it needs of the ACLs, see "Security" in the
// package doc, is the right to read the directory): it watches for the
// directory's creation instead (an exists watch), and once it is created
// lists it with a child watch, as above. The directory's creation, and its
// deletion once empty, make the channel receive too.
//
// A watch outlives a lost connection while the session lives: the client
// sets it again when it reconnects, and the server then reports the changes
// made meanwhile. The channel is closed when the watch ends by itself: the
// session expired, the Driver was closed, or the session has been without a
// connection for longer than its timeout plus a margin (when a queued
// waiter gives up too: the session may have expired), or arming it again
// failed. The caller then reads the state again and watches anew. stop ends
// the watch and waits for its goroutine; it does not close the channel. The
// client library keeps a stopped watch's registration (a buffered channel
// nobody reads) until the directory next changes or the session ends, as
// ZooKeeper before 3.6 cannot remove a watch. Errors wrap
// backend.ErrInvalidKey (a bad key, before any I/O), backend.ErrUnavailable
// (the directory could not be read, or ctx ended first: then ctx's error
// too) or backend.ErrClosed.
func (d *Driver) WatchChanges(ctx context.Context, key string) (changed <-chan struct{}, stop func(), err error) {
	if err := backend.ValidateKey(key); err != nil {
		return nil, nil, err
	}
	dir := d.parent(key)
	ev, err := d.armDir(ctx, dir, false)
	switch {
	case errors.Is(err, backend.ErrClosed):
		return nil, nil, err
	case err != nil:
		return nil, nil, unavailable("watching "+dir, err)
	}
	wctx, cancel := context.WithCancel(d.ctx)
	ch := make(chan struct{}, 1)
	done := make(chan struct{})
	if !d.bg.Go(func() {
		defer close(done)
		d.watchDir(wctx, dir, ev, ch)
	}) {
		cancel()
		return nil, nil, backend.ErrClosed
	}
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}, nil
}

// armDir sets a watch on dir: a child watch, or, if dir does not exist, an
// exists watch that fires when it is created. It reads and never writes.
// queued is read's: the first arming gives up on an ensemble that no server
// of answers for a reconnect cycle, as an Inspect would; the later ones, of
// a watch in place, ride the loss out as a queued waiter does.
func (d *Driver) armDir(ctx context.Context, dir string, queued bool) (<-chan zk.Event, error) {
	// On an error, ev and ok are not read: a call abandoned when ctx
	// ended may still set them.
	for {
		var ev <-chan zk.Event
		err := d.read(ctx, queued, func() (err error) {
			_, _, ev, err = d.conn.ChildrenW(dir)
			return err
		})
		switch {
		case err == nil:
			return ev, nil
		case !errors.Is(err, zk.ErrNoNode):
			return nil, err
		}
		var ok bool
		err = d.read(ctx, queued, func() (err error) {
			ok, _, ev, err = d.conn.ExistsW(dir)
			return err
		})
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return ev, nil
		}
		// Created since the listing: list it with a child watch. (The
		// data watch ExistsW set on it is left to fire unread.)
	}
}

// watchDir is the goroutine of a watch on dir, armed as ev: it waits for ev
// to fire, arms the watch again, and only then sends on ch (without
// blocking: ch holds one pending signal). It closes ch when the watch ends
// by itself, and returns without closing it when ctx ends (stop; the
// Driver's Close ends the watch by itself).
func (d *Driver) watchDir(ctx context.Context, dir string, ev <-chan zk.Event, ch chan<- struct{}) {
	for {
		e, err := d.awaitWatch(ctx, ev)
		switch {
		case ctx.Err() != nil && d.ctx.Err() == nil:
			return // stopped
		case err != nil:
			d.log.Debug("dlock/zookeeper: change watch ended", "dir", dir, "err", err)
			close(ch)
			return
		case e.Type == zk.EventNotWatching:
			// The session expired, or the client was closed: the
			// server forgot the watch.
			d.log.Debug("dlock/zookeeper: change watch ended", "dir", dir, "err", e.Err)
			close(ch)
			return
		}
		ev, err = d.armDir(ctx, dir, true)
		switch {
		case ctx.Err() != nil && d.ctx.Err() == nil:
			return // stopped
		case err != nil:
			d.log.Debug("dlock/zookeeper: change watch ended: arming it again", "dir", dir, "err", err)
			close(ch)
			return
		}
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// awaitWatch waits for ev to fire and returns its event. It returns an
// error when ctx ends (stop, or the Driver's Close) or the session has been
// without a connection for longer than its timeout plus cutOffMargin (see
// cutOff): a watch that cannot tell whether its session still lives ends.
func (d *Driver) awaitWatch(ctx context.Context, ev <-chan zk.Event) (zk.Event, error) {
	for {
		left, changed, err := d.cutOff()
		if err != nil {
			return zk.Event{}, err
		}
		var expiry <-chan time.Time
		var t *time.Timer
		if left > 0 {
			t = time.NewTimer(left)
			expiry = t.C
		}
		select {
		case e, ok := <-ev:
			if t != nil {
				t.Stop()
			}
			if !ok {
				// The client closes a watch's channel after its one
				// event: not seen here, but not a change either.
				return zk.Event{Type: zk.EventNotWatching}, nil
			}
			return e, nil
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return zk.Event{}, fmt.Errorf("%w: zookeeper: %w", backend.ErrClosed, ctx.Err())
		case <-changed:
		case <-expiry:
		}
		if t != nil {
			t.Stop()
		}
	}
}
