package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memory"
)

type harness struct{ s *memory.Store }

func (h harness) NewLocker(_ context.Context, opts *dlock.Options) (*dlock.Locker, error) {
	return memory.New(h.s, opts)
}

func (h harness) Expire(_ context.Context, key string) error {
	h.s.Expire(key)
	return nil
}

func (h harness) Residue(_ context.Context, key string) (bool, error) {
	return h.s.Held(key) || h.s.Waiters(key) > 0, nil
}

func (h harness) Close() {}

func TestConformance(t *testing.T) {
	conformance.Run(t, func(context.Context, *testing.T) (conformance.Harness, error) {
		return harness{memory.NewStore()}, nil
	})
}

// plainDriver hides the memory driver's optional interfaces, so the suite
// also covers the dlock layer's polling loop and its deadline-based loss
// detection, as a backend without wake-ups or loss notification gets them.
type plainDriver struct{ backend.Driver }

func (d plainDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	l, err := d.Driver.TryAcquire(ctx, req)
	if err != nil {
		return nil, err
	}
	return plainLease{l}, nil
}

type plainLease struct{ backend.Lease }

type plainHarness struct{ harness }

func (h plainHarness) NewLocker(_ context.Context, opts *dlock.Options) (*dlock.Locker, error) {
	return driver.New(plainDriver{memory.NewDriver(h.s)}, opts)
}

func TestConformancePolling(t *testing.T) {
	var _ backend.Waiter = memory.NewDriver(nil)
	if _, ok := any(plainDriver{}).(backend.Waiter); ok {
		t.Fatal("plainDriver must not be a Waiter")
	}
	if _, ok := any(plainLease{}).(backend.LossNotifier); ok {
		t.Fatal("plainLease must not be a LossNotifier")
	}
	conformance.Run(t, func(context.Context, *testing.T) (conformance.Harness, error) {
		return plainHarness{harness{memory.NewStore()}}, nil
	})
}

func TestInspect(t *testing.T) {
	var _ backend.Inspector = memory.NewDriver(nil)
	conformance.RunInspect(t, func(context.Context, *testing.T) (conformance.Harness, error) {
		return harness{memory.NewStore()}, nil
	}, conformance.InspectCaps{Token: true, TTL: true})
}

// TestWriterReservation: a waiting writer's attempt that finds readers
// keeps new readers out for Request.Wait, also once the last reader has
// gone, so that a reader cannot slip in between that release and the
// writer's next attempt; a TryAcquire (Wait 0) reserves nothing. (Seen
// red when the reservation lived with the readers' entry: the conformance
// case WriterNotStarved then hung now and then.)
func TestWriterReservation(t *testing.T) {
	d := memory.NewDriver(memory.NewStore())
	ctx := t.Context()
	reader := backend.Request{Key: "k", TTL: time.Minute, Shared: true}
	r1, err := d.TryAcquire(ctx, reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, backend.Request{Key: "k", TTL: time.Minute}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("writer's TryAcquire while a reader holds: %v", err)
	}
	r2, err := d.TryAcquire(ctx, reader)
	if err != nil {
		t.Fatalf("a reader after a writer's TryAcquire (which reserves nothing): %v", err)
	}
	writer := backend.Request{Key: "k", TTL: time.Minute, Wait: time.Minute}
	if _, err := d.TryAcquire(ctx, writer); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("waiting writer's attempt while readers hold: %v", err)
	}
	for _, r := range []backend.Lease{r1, r2} {
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.TryAcquire(ctx, reader); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("a reader on the free key a writer reserved: %v; want refused", err)
	}
	w, err := d.TryAcquire(ctx, writer)
	if err != nil {
		t.Fatalf("the writer's next attempt: %v", err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r3, err := d.TryAcquire(ctx, reader)
	if err != nil {
		t.Fatalf("a reader once the writer has been and gone: %v", err)
	}
	_ = r3.Release(ctx)
}
