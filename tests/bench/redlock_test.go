package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

func TestMain(m *testing.M) { servers.Main(m) }

// fiveClients returns one client per shared Redis server (five), closed
// when tb ends.
func fiveClients(tb testing.TB) []*goredis.Client {
	tb.Helper()
	var cs []*goredis.Client
	for _, s := range servers.Redis(tb, 5) {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
		tb.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	return cs
}

// lockers returns, for one set of five clients, the two contenders:
// redsync (5 pools) and dlock's redlock backend.
func lockers(tb testing.TB) map[string]func(key string) conformance.LockFunc {
	cs := fiveClients(tb)
	var pools []redsyncredis.Pool
	var ucs []goredis.UniversalClient
	for _, c := range cs {
		pools = append(pools, rsgoredis.NewPool(c))
		ucs = append(ucs, c)
	}
	rs := redsync.New(pools...)
	l, err := redlock.New(tb.Context(), ucs, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return map[string]func(string) conformance.LockFunc{
		"redsync": func(key string) conformance.LockFunc {
			return func(ctx context.Context) (func(context.Context) error, error) {
				m := rs.NewMutex(key, redsync.WithExpiry(10*time.Second), redsync.WithTries(1<<30))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
			}
		},
		"dlock": func(key string) conformance.LockFunc {
			ao := &dlock.AcquireOptions{TTL: 10 * time.Second}
			return conformance.LockerFunc(l, key, ao)
		},
	}
}

// BenchmarkRedlockCycle: one uncontended cycle (acquire + release) on five
// masters, each goroutine on its own key, at 1 and 16 goroutines.
func BenchmarkRedlockCycle(b *testing.B) {
	ls := lockers(b)
	var seq atomic.Int64
	for _, lib := range []string{"redsync", "dlock"} {
		for _, p := range []int{1, 16} {
			b.Run(fmt.Sprintf("lib=%s/p%d", lib, p), func(b *testing.B) {
				b.SetParallelism(max(1, p/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					lock := ls[lib](fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), seq.Add(1)))
					ctx := context.Background()
					for pb.Next() {
						unlock, err := lock(ctx)
						if err != nil {
							b.Error(err)
							return
						}
						if err := unlock(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkRedlockHandoff: 8 contenders, each with its own five clients,
// on one key, hold 0. Besides the time per acquisition it reports the
// handoff waits (from a release to the next acquisition by another
// contender) at p50 and p99, and the spread: the most acquisitions one
// contender made divided by the fewest (1 is perfectly even).
func BenchmarkRedlockHandoff(b *testing.B) {
	for _, lib := range []string{"redsync", "dlock"} {
		b.Run("lib="+lib, func(b *testing.B) {
			key := fmt.Sprintf("handoff-%d", time.Now().UnixNano())
			locks := make([]conformance.LockFunc, 8)
			for i := range locks {
				locks[i] = lockers(b)[lib](key)
			}
			benchHandoff(b, locks)
		})
	}
}

// benchHandoff is conformance.BenchHandoff with wait percentiles and the
// per-contender spread: len(locks) goroutines, each with its own LockFunc,
// take and release the lock b.N times in all.
func benchHandoff(b *testing.B, locks []conformance.LockFunc) {
	var (
		mu     sync.Mutex
		waits  []time.Duration
		counts = make([]int, len(locks))
		last   time.Time // the last release; zero once taken
		lastBy = -1
		next   atomic.Int64
		left   atomic.Int64
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	var wg sync.WaitGroup
	for range locks {
		me := int(next.Add(1) - 1)
		lock := locks[me]
		wg.Go(func() {
			ctx := context.Background()
			for left.Add(-1) >= 0 {
				unlock, err := lock(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				now := time.Now()
				mu.Lock()
				if !last.IsZero() && lastBy != me {
					waits = append(waits, now.Sub(last))
				}
				last, lastBy = time.Time{}, me
				counts[me]++
				mu.Unlock()
				if err := unlock(ctx); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				last = time.Now()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if len(waits) > 0 {
		slices.Sort(waits)
		b.ReportMetric(float64(waits[len(waits)/2].Nanoseconds()), "wait-p50-ns")
		b.ReportMetric(float64(waits[len(waits)*99/100].Nanoseconds()), "wait-p99-ns")
	}
	lo, hi := slices.Min(counts), slices.Max(counts)
	if lo > 0 {
		b.ReportMetric(float64(hi)/float64(lo), "spread")
	} else if b.N >= 10*len(locks) {
		b.ReportMetric(float64(hi), "spread") // a contender starved: as bad as hi
	}
}
