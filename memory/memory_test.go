package memory_test

import (
	"context"
	"testing"

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
