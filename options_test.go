package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memory"
)

// TestNegativeMaxHold: a negative MaxHold is bad input with or without
// AutoRefresh (the doc of AcquireOptions.MaxHold says so), refused before
// any I/O; a positive one without AutoRefresh bounds nothing and is
// accepted.
func TestNegativeMaxHold(t *testing.T) {
	store := memory.NewStore()
	l, err := memory.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, auto := range []bool{false, true} {
		_, err := l.TryAcquire(t.Context(), "maxhold", &dlock.AcquireOptions{AutoRefresh: auto, MaxHold: -time.Second})
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("TryAcquire with MaxHold -1s, AutoRefresh %v = %v, want ErrInvalidConfig", auto, err)
		}
		if store.Held("maxhold") {
			t.Fatalf("TryAcquire with MaxHold -1s, AutoRefresh %v took the lock", auto)
		}
	}
	le, err := l.TryAcquire(t.Context(), "maxhold", &dlock.AcquireOptions{TTL: time.Second, MaxHold: time.Millisecond})
	if err != nil {
		t.Fatalf("TryAcquire with MaxHold 1ms and no AutoRefresh: %v, want the lock (MaxHold bounds nothing then)", err)
	}
	_ = le.Release(t.Context())
}

// exclusiveOnly is a counting memory driver that serves no shared leases.
type exclusiveOnly struct{ *countingDriver }

func (e exclusiveOnly) Guarantees() backend.Guarantees {
	g := e.countingDriver.Guarantees()
	g.Shared = false
	return g
}

// TestSharedOptionsBeforeIO: a negative Permits is ErrInvalidConfig, and a
// shared acquire (Permits or Shared) on a backend that serves none is
// ErrUnsupported, both before any attempt reaches the backend; Permits
// implies a shared lease (the request the backend sees).
func TestSharedOptionsBeforeIO(t *testing.T) {
	d := &countingDriver{Driver: memory.NewDriver(memory.NewStore())}
	l, err := driver.New(exclusiveOnly{d}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct {
		o    dlock.AcquireOptions
		want error
	}{
		{dlock.AcquireOptions{Permits: -1}, dlock.ErrInvalidConfig},
		{dlock.AcquireOptions{Permits: 2}, dlock.ErrUnsupported},
		{dlock.AcquireOptions{Shared: true}, dlock.ErrUnsupported},
	} {
		for _, try := range []bool{true, false} {
			var err error
			if try {
				_, err = l.TryAcquire(t.Context(), "k", &c.o)
			} else {
				_, err = l.Acquire(t.Context(), "k", &c.o)
			}
			if !errors.Is(err, c.want) {
				t.Errorf("acquire (try %v) with %+v: %v; want %v", try, c.o, err, c.want)
			}
		}
	}
	if n := d.attempts.Load(); n != 0 {
		t.Errorf("%d attempts reached the backend; want none", n)
	}
	if _, err := l.TryAcquire(t.Context(), "k", nil); err != nil || d.attempts.Load() != 1 {
		t.Fatalf("an exclusive TryAcquire: %v, %d attempts; want the lock in one", err, d.attempts.Load())
	}
}

// TestPermitsMismatchError: the error names both numbers and matches
// ErrInvalidConfig (memory store, which serves shared leases).
func TestPermitsMismatchError(t *testing.T) {
	l, err := memory.New(memory.NewStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "sem", &dlock.AcquireOptions{Permits: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(t.Context())
	_, err = l.TryAcquire(t.Context(), "sem", &dlock.AcquireOptions{Permits: 2})
	var pe *dlock.PermitsError
	if !errors.Is(err, dlock.ErrInvalidConfig) || !errors.As(err, &pe) || pe.Asked != 2 || pe.Held != 3 ||
		!strings.Contains(err.Error(), "asked for a permit of 2, but the key's holders hold a permit of 3") {
		t.Errorf("TryAcquire of a permit of 2 while permits of 3 are held: %v", err)
	}
	_, err = l.TryAcquire(t.Context(), "sem", &dlock.AcquireOptions{Shared: true})
	if !errors.As(err, &pe) || pe.Asked != 0 || !strings.Contains(err.Error(), "asked for a read-write lock's reader") {
		t.Errorf("a reader's TryAcquire on a semaphore's key: %v", err)
	}
}

// TestPermitsMismatchBehindOwnWaiters: a Locker whose own waiters are in
// line for a key still reports a permits mismatch at once (found by a
// review: the request joined the line without an attempt and waited for
// as long as the waiter ahead of it).
func TestPermitsMismatchBehindOwnWaiters(t *testing.T) {
	s := memory.NewStore()
	a, err := memory.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := memory.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 2 {
		if _, err := a.TryAcquire(t.Context(), "sem", &dlock.AcquireOptions{Permits: 2, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := b.Acquire(t.Context(), "sem", &dlock.AcquireOptions{Permits: 2})
		waiting <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); s.Waiters("sem") == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b's waiter never watched the key")
		}
	}
	for _, o := range []*dlock.AcquireOptions{{Permits: 3}, {Shared: true}} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		start := time.Now()
		_, err := b.Acquire(ctx, "sem", o)
		cancel()
		var pe *dlock.PermitsError
		if !errors.As(err, &pe) || time.Since(start) > time.Second {
			t.Errorf("Acquire with %+v behind the Locker's own waiter: %v after %v; want a *PermitsError at once", *o, err, time.Since(start).Round(time.Millisecond))
		}
	}
	select {
	case err := <-waiting:
		t.Fatalf("the waiter ahead returned: %v", err)
	default:
	}
}
