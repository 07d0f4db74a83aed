package memory_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/memory"
)

type harness struct{ s *memory.Store }

func (h harness) NewLocker(_ context.Context, opts *dlock.Options) (*dlock.Locker, error) {
	return memory.New(h.s, opts), nil
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
