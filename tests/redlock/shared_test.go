package redlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// commandCounter counts every command a client sends, alone or in a
// pipeline.
type commandCounter struct{ n atomic.Int64 }

func (h *commandCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *commandCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *commandCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestSharedUnsupported: Redlock serves no shared leases (issue 24):
// Guarantees().Shared is false, and a semaphore permit or a reader's
// lease, by TryAcquire or Acquire, fails with ErrUnsupported without
// sending anything to any node.
func TestSharedUnsupported(t *testing.T) {
	t.Parallel()
	cs := clients(t, addrs(servers.Redis(t, 3)))
	l, err := redlock.New(t.Context(), cs, &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Guarantees().Shared {
		t.Fatal("Guarantees().Shared is true")
	}
	var sent commandCounter
	for _, c := range cs {
		c.AddHook(&sent)
	}
	key := uniqueKey(t)
	for _, o := range []*dlock.AcquireOptions{{Permits: 4}, {Shared: true}, {Permits: 1, Shared: true}} {
		if _, err := l.TryAcquire(t.Context(), key, o); !errors.Is(err, dlock.ErrUnsupported) {
			t.Errorf("TryAcquire %+v: %v, want ErrUnsupported", o, err)
		}
		if _, err := l.Acquire(t.Context(), key, o); !errors.Is(err, dlock.ErrUnsupported) {
			t.Errorf("Acquire %+v: %v, want ErrUnsupported", o, err)
		}
	}
	if n := sent.n.Load(); n != 0 {
		t.Errorf("%d commands sent to the nodes; want none", n)
	}
	// The hook counts: a plain acquire is sent.
	le, err := l.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if sent.n.Load() == 0 {
		t.Error("the hook counted nothing for a plain acquire and release")
	}
}
