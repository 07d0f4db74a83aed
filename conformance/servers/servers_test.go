package servers_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conformance/servers"
)

func TestMain(m *testing.M) { servers.Main(m) }

func ping(ctx context.Context, addr string, timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  timeout,
		ReadTimeout:  timeout,
		WriteTimeout: timeout,
		MaxRetries:   -1,
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.Ping(ctx).Err()
}

// eventually polls f until it succeeds or a generous deadline passes.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after 30s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestSharedRedis(t *testing.T) {
	srvs := servers.Redis(t, 2)
	if len(srvs) != 2 {
		t.Fatalf("Redis(t, 2) returned %d servers", len(srvs))
	}
	if srvs[0].Addr() == srvs[1].Addr() {
		t.Fatalf("two servers share the address %s", srvs[0].Addr())
	}
	for _, s := range srvs {
		if err := ping(t.Context(), s.Addr(), 5*time.Second); err != nil {
			t.Fatalf("PING %s: %v", s, err)
		}
	}
	again := servers.Redis(t, 1)
	if again[0] != srvs[0] {
		t.Fatalf("second Redis call started new servers instead of reusing the shared set")
	}
}

func TestFaultControls(t *testing.T) {
	ctx := t.Context()
	srvs, err := servers.StartRedis(ctx, 1)
	if err != nil {
		t.Fatalf("StartRedis: %v", err)
	}
	s := srvs[0]
	t.Cleanup(func() {
		if err := s.Terminate(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("Terminate: %v", err)
		}
	})
	if err := ping(ctx, s.Addr(), 5*time.Second); err != nil {
		t.Fatalf("PING %s: %v", s, err)
	}

	t.Run("StopStart", func(t *testing.T) {
		if err := s.Stop(ctx); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if err := ping(ctx, s.Addr(), time.Second); err == nil {
			t.Fatalf("PING %s succeeded on a stopped server", s)
		}
		if err := s.Start(ctx); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := ping(ctx, s.Addr(), 5*time.Second); err != nil {
			t.Fatalf("PING %s after Start: %v", s, err)
		}
	})

	t.Run("KillStart", func(t *testing.T) {
		if err := s.Kill(ctx); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		if err := ping(ctx, s.Addr(), time.Second); err == nil {
			t.Fatalf("PING %s succeeded on a killed server", s)
		}
		if err := s.Start(ctx); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := ping(ctx, s.Addr(), 5*time.Second); err != nil {
			t.Fatalf("PING %s after Start: %v", s, err)
		}
	})

	t.Run("PauseUnpause", func(t *testing.T) {
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		if err := ping(ctx, s.Addr(), 300*time.Millisecond); err == nil {
			t.Fatalf("PING %s succeeded on a paused server", s)
		}
		if err := s.Unpause(ctx); err != nil {
			t.Fatalf("Unpause: %v", err)
		}
		eventually(t, "PING after Unpause", func() error {
			return ping(ctx, s.Addr(), 2*time.Second)
		})
	})
}
