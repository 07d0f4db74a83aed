package etcd_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/tests/servers"
)

// BenchmarkCycle measures one uncontended lock cycle, each goroutine on its
// own key, on a single-node cluster, beside etcd's concurrency.Mutex:
//
//	mutex-session  NewSession + Mutex.Lock + Unlock + Session.Close, as the
//	               common tutorial does (a lease per lock, as dlock has)
//	mutex-reused   Lock + Unlock on one long-lived Session per goroutine
//	               (2 round trips; every lock shares one lease)
//	locker         dlock Locker.Acquire + Lease.Release (a lease per grant:
//	               Grant, Txn, Txn, Revoke)
//
//	make bench ARGS='-bench . -count 6 ./etcd/' | tee /tmp/etcd.txt
func BenchmarkCycle(b *testing.B) {
	eps := servers.Etcd(b, 1).Endpoints()
	c := newClient(b, eps)
	l := newLocker(b, eps, nil)
	ctx := b.Context()
	var seq atomic.Int64
	newKey := func() string { return fmt.Sprintf("bench/%d/%d", time.Now().UnixNano(), seq.Add(1)) }
	ttl := 10 * time.Second

	cycles := []struct {
		name  string
		cycle func(key string) (func() error, func())
	}{
		{"mutex-session", func(key string) (func() error, func()) {
			return func() error {
				s, err := concurrency.NewSession(c, concurrency.WithTTL(int(ttl/time.Second)))
				if err != nil {
					return err
				}
				defer s.Close()
				m := concurrency.NewMutex(s, "raw/"+key)
				if err := m.Lock(ctx); err != nil {
					return err
				}
				return m.Unlock(ctx)
			}, func() {}
		}},
		{"mutex-reused", func(key string) (func() error, func()) {
			s, err := concurrency.NewSession(c, concurrency.WithTTL(int(ttl/time.Second)))
			if err != nil {
				b.Fatal(err)
			}
			m := concurrency.NewMutex(s, "raw/"+key)
			return func() error {
				if err := m.Lock(ctx); err != nil {
					return err
				}
				return m.Unlock(ctx)
			}, func() { _ = s.Close() }
		}},
		{"locker", func(key string) (func() error, func()) {
			ao := &dlock.AcquireOptions{TTL: ttl}
			return func() error {
				le, err := l.Acquire(ctx, key, ao)
				if err != nil {
					return err
				}
				return le.Release(ctx)
			}, func() {}
		}},
	}
	for _, cy := range cycles {
		for _, p := range []int{1, 16} {
			b.Run(fmt.Sprintf("lib=%s/w=%d", cy.name, p), func(b *testing.B) {
				b.SetParallelism(max(1, p/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					cycle, done := cy.cycle(newKey())
					defer done()
					for pb.Next() {
						if err := cycle(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkHandoff measures contended handoff on one key (8 goroutines,
// each with its own client, hold 0):
//
//	mutex   concurrency.Mutex, one Session per goroutine
//	locker  dlock Locker.Acquire
//
// It reports the mean handoff time (handoff-ns, as
// conformance.BenchHandoff), its distribution (p50-ns, p90-ns, p99-ns,
// max-ns) and slow-%, the share of handoffs that took longer than 50ms (a
// waiter served by etcd's 100ms unsynced-watcher loop instead of at once).
//
//	make bench ARGS='-bench Handoff -count 6 ./etcd/'
func BenchmarkHandoff(b *testing.B) {
	const goroutines = 8
	eps := servers.Etcd(b, 1).Endpoints()
	makers := []struct {
		name string
		make func(b *testing.B, key string) conformance.LockFunc
	}{
		{"mutex", func(b *testing.B, key string) conformance.LockFunc {
			s, err := concurrency.NewSession(newClient(b, eps), concurrency.WithTTL(10))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			m := concurrency.NewMutex(s, "raw/"+key)
			return func(ctx context.Context) (func(context.Context) error, error) {
				return m.Unlock, m.Lock(ctx)
			}
		}},
		{"locker", func(b *testing.B, key string) conformance.LockFunc {
			l := newLocker(b, eps, nil)
			ao := &dlock.AcquireOptions{TTL: 10 * time.Second}
			return conformance.LockerFunc(l, key, ao)
		}},
	}
	for _, mk := range makers {
		b.Run("lib="+mk.name, func(b *testing.B) {
			key := fmt.Sprintf("bench/handoff/%d", time.Now().UnixNano())
			locks := make([]conformance.LockFunc, goroutines)
			for i := range locks {
				locks[i] = mk.make(b, key)
			}
			benchHandoff(b, locks)
		})
	}
}

// benchHandoff is conformance.BenchHandoff with the distribution of the
// handoff times: the time from a release to the next grant to another
// goroutine.
func benchHandoff(b *testing.B, locks []conformance.LockFunc) {
	var (
		next   atomic.Int64
		last   atomic.Int64 // nanoseconds since start of the last release; -1 once taken
		lastBy atomic.Int64
		mu     sync.Mutex
		waits  []time.Duration
	)
	start := time.Now()
	last.Store(-1)
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
			if at := last.Swap(-1); at >= 0 && lastBy.Load() != me {
				w := time.Since(start) - time.Duration(at)
				mu.Lock()
				waits = append(waits, w)
				mu.Unlock()
			}
			lastBy.Store(me)
			if err := unlock(ctx); err != nil {
				b.Error(err)
				return
			}
			last.Store(int64(time.Since(start)))
		}
	})
	b.StopTimer()
	if len(waits) == 0 {
		return
	}
	slices.Sort(waits)
	q := func(f float64) float64 { return float64(waits[min(len(waits)-1, int(f*float64(len(waits))))]) }
	var sum time.Duration
	slow := 0
	for _, w := range waits {
		sum += w
		if w > 50*time.Millisecond {
			slow++
		}
	}
	b.ReportMetric(float64(sum)/float64(len(waits)), "handoff-ns")
	b.ReportMetric(q(0.5), "p50-ns")
	b.ReportMetric(q(0.9), "p90-ns")
	b.ReportMetric(q(0.99), "p99-ns")
	b.ReportMetric(float64(waits[len(waits)-1]), "max-ns")
	b.ReportMetric(100*float64(slow)/float64(len(waits)), "slow-%")
}
