package dlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memory"
)

// Done is closed at the Deadline at the latest, also when it is first
// called (or Context first made) after the Deadline: a non-blocking look,
// the natural port of redsync's Valid, never finds a lease held past its
// Deadline. (Before, the first Done made the channel and armed the deadline
// timer, which fired on another goroutine: the channel it returned was
// still open for a while, and such a look said the lease was held.)
func TestDoneFirstCalledAfterDeadline(t *testing.T) {
	for _, first := range []string{"Done", "Context"} {
		t.Run(first, func(t *testing.T) {
			t.Parallel()
			// Many leases, so that a fix that only narrows the window
			// (instead of closing it) is caught too.
			const n = 20
			l := mustMem(t, memory.NewStore(), nil)
			defer l.Close()
			leases := make([]*dlock.Lease, n)
			for i := range leases {
				le, err := l.TryAcquire(t.Context(), string(rune('a'+i)), &dlock.AcquireOptions{TTL: 30 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				leases[i] = le
			}
			// Deadline neither looks at the clock nor ends the lease.
			for _, le := range leases {
				for !time.Now().After(le.Deadline()) {
					time.Sleep(time.Millisecond)
				}
			}
			open := 0
			for _, le := range leases {
				switch first {
				case "Done":
					select {
					case <-le.Done():
					default:
						open++
					}
				case "Context":
					ctx, cancel := le.Context(t.Context())
					if ctx.Err() == nil {
						open++
					}
					cancel()
				}
			}
			if open > 0 {
				t.Fatalf("%d of %d leases: the first %s after the Deadline says the lease is held", open, n, first)
			}
			for _, le := range leases {
				if err := le.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
					t.Errorf("Err after the Deadline = %v, want ErrLeaseLost", err)
				}
			}
		})
	}
}
