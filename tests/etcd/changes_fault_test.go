package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/etcd"
)

// TestWatchChangesFrozenMember: the member that serves a
// WatchChanges watch freezes; a key is put and deleted in the lock's
// directory through the live members. The ChangeWatcher contract wants a
// receive (a change) or a close (the connection was lost).
func TestWatchChangesFrozenMember(t *testing.T) {
	c := faultCluster(t)
	eps := c.Endpoints()
	key := uniqueKey(t)
	base := make([]int, len(c.Members))
	for i, m := range c.Members {
		var err error
		if base[i], err = watchers(t.Context(), m.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	d, err := etcd.NewDriver(t.Context(), newClient(t, eps), nil)
	if err != nil {
		t.Fatal(err)
	}
	l := mustNew(t, d, nil)
	defer l.Close()
	ch, stop, err := d.WatchChanges(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	on := -1
	for end := time.Now().Add(slack); on < 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the watch was not found on any member")
		}
		for i, m := range c.Members {
			if n, err := watchers(t.Context(), m.Addr()); err == nil && n > base[i] {
				on = i
			}
		}
	}
	t.Logf("the change watch is on member %d", on)
	if err := c.Members[on].Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Members[on].Unpause(context.WithoutCancel(t.Context())) }()
	var others []string
	for i, m := range c.Members {
		if i != on {
			others = append(others, m.Addr())
		}
	}
	pred := putPredecessor(t, newClient(t, others), key, 120)
	deletePredecessor(t, newClient(t, others), pred, "deleting through the live members")
	const wait = 30 * time.Second // > 2 request timeouts (5s) + slack
	select {
	case _, ok := <-ch:
		t.Logf("received (open=%v)", ok)
	case <-time.After(wait):
		t.Fatalf("a key was created and deleted in the lock's directory %v ago through the live members; the change watch (on frozen member %d) neither received nor closed", wait, on)
	}
}

// TestWatchChangesDuringClose: a WatchChanges waiting for its
// watch to be created when the Driver is closed.
func TestWatchChangesDuringClose(t *testing.T) {
	c := ownCluster(t, 1)
	d, err := etcd.NewDriver(t.Context(), newClient(t, c.Endpoints()), &etcd.Options{RequestTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Members[0].Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Members[0].Unpause(context.WithoutCancel(t.Context())) }()
	type res struct {
		err  error
		took time.Duration
	}
	got := make(chan res, 1)
	go func() {
		start := time.Now()
		_, stop, err := d.WatchChanges(t.Context(), uniqueKey(t))
		if stop != nil {
			stop()
		}
		got <- res{err, time.Since(start)}
	}()
	time.Sleep(time.Second)
	start := time.Now()
	cerr := d.Close()
	t.Logf("Close: %v after %v", cerr, time.Since(start).Round(time.Millisecond))
	r := <-got
	t.Logf("WatchChanges: %v after %v; ErrClosed=%v ErrUnavailable=%v", r.err, r.took.Round(time.Millisecond),
		errors.Is(r.err, backend.ErrClosed), errors.Is(r.err, backend.ErrUnavailable))
	if !errors.Is(r.err, backend.ErrClosed) {
		t.Errorf("WatchChanges ended by Close: %v, want ErrClosed", r.err)
	}
}
