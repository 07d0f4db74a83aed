package redis_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/dlock-go/dlock/redis"
)

// pastDeadline is a context whose deadline has passed but whose timer has
// not fired yet: Err is still nil, as a context.WithTimeout's is for an
// instant on a busy machine.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }
func (pastDeadline) Err() error                  { return nil }

// TestAtDeadline: a command that failed with a timeout once its context's
// deadline passed reports context.DeadlineExceeded, even before the
// context's timer marks it done (TestAcquireCancelledInFlightCleansUp
// failed so in CI: "redis: i/o timeout", no DeadlineExceeded); a failure
// before the deadline is left as it is.
func TestAtDeadline(t *testing.T) {
	timeout := os.ErrDeadlineExceeded // what a read past its deadline returns
	if err := redis.AtDeadline(pastDeadline{context.Background()}, timeout); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, timeout) {
		t.Errorf("deadline passed, timer not fired: %v; want the timeout and context.DeadlineExceeded", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := redis.AtDeadline(ctx, timeout); err != timeout {
		t.Errorf("before the deadline: %v; want %v unchanged", err, timeout)
	}
	cancel()
	if err := redis.AtDeadline(ctx, timeout); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v; want context.Canceled added", err)
	}
	if err := redis.AtDeadline(pastDeadline{context.Background()}, nil); err != nil {
		t.Errorf("no error: %v", err)
	}
}
