package conformance

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// LockFunc takes a lock (blocking until it is held) and returns the
// function that releases it. Benchmarks wrap each contender's lock in one.
type LockFunc func(ctx context.Context) (unlock func(context.Context) error, err error)

// BenchHandoff runs the contended handoff benchmark every backend package
// has: len(locks) goroutines, each with its own LockFunc (its own client, as
// a separate process would have) on one key, take turns. It reports
// handoff-ns, the mean time from a holder's release returning to another
// goroutine's acquire returning (the wait a queued process sees, which
// polling designs pay as their retry interval); ns/op is the cycle time.
func BenchHandoff(b *testing.B, locks []LockFunc) {
	var (
		next     atomic.Int64
		last     atomic.Int64 // UnixNano of the last release; 0 once taken
		lastBy   atomic.Int64
		waited   atomic.Int64 // sum of handoff times
		handoffs atomic.Int64
	)
	b.ResetTimer()
	b.SetParallelism(max(1, len(locks)/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		me := next.Add(1) - 1
		lock := locks[me%int64(len(locks))]
		ctx := context.Background()
		for pb.Next() {
			unlock, err := lock(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if at := last.Swap(0); at != 0 && lastBy.Load() != me {
				waited.Add(nanotime() - at)
				handoffs.Add(1)
			}
			lastBy.Store(me)
			if err := unlock(ctx); err != nil {
				b.Error(err)
				return
			}
			last.Store(nanotime())
		}
	})
	if n := handoffs.Load(); n > 0 {
		b.ReportMetric(float64(waited.Load())/float64(n), "handoff-ns")
	}
}

// epoch is the origin of nanotime, which reads the monotonic clock.
var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// LockerFunc is the LockFunc of a Locker: Acquire of key with ao, and the
// lease's Release.
func LockerFunc(l *dlock.Locker, key string, ao *dlock.AcquireOptions) LockFunc {
	return func(ctx context.Context) (func(context.Context) error, error) {
		le, err := l.Acquire(ctx, key, ao)
		if err != nil {
			return nil, err
		}
		return le.Release, nil
	}
}
