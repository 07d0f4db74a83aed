package redis_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redis"
)

// rawRelease is the compare-and-delete of the raw baseline.
var rawRelease = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkCycle measures one uncontended lock cycle (acquire + release),
// each goroutine on its own key:
//
//	raw     a plain go-redis loop: SET key val NX PX 30000, then one EVALSHA
//	        compare-and-delete (the ceiling: two round trips, nothing else)
//	dlock   Driver.TryAcquire + Lease.Release
//	locker  dlock.Locker.TryAcquire + Lease.Release (validation, lease
//	        bookkeeping and loss tracking on top of the driver)
//
// pN runs N goroutines (b.SetParallelism(N/GOMAXPROCS)).
//
//	make bench ARGS='-bench Cycle -count 6 ./redis/' | tee /tmp/bench.txt
func BenchmarkCycle(b *testing.B) {
	c := serverClient(b)
	ctx := b.Context()
	d := newDriver(b, c, nil)
	l := dlock.New(d, nil) // not closed: closing it would close d twice
	if err := rawRelease.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	newKey := func() string { return fmt.Sprintf("bench/%d/%d", time.Now().UnixNano(), seq.Add(1)) }

	cycles := []struct {
		name string
		// cycle returns the function doing one lock cycle on key.
		cycle func(key string) func() error
	}{
		{"raw", func(key string) func() error {
			k, val := "raw:"+key, []any{"owner-" + key}
			keys := []string{k}
			return func() error {
				ok, err := c.SetNX(ctx, k, val[0], 30*time.Second).Result()
				if err != nil || !ok {
					return fmt.Errorf("SET NX: %v %v", ok, err)
				}
				n, err := rawRelease.Run(ctx, c, keys, val...).Int64()
				if err != nil || n != 1 {
					return fmt.Errorf("release: %v %v", n, err)
				}
				return nil
			}
		}},
		{"dlock", func(key string) func() error {
			return func() error {
				le, err := d.TryAcquire(ctx, key, 30*time.Second)
				if err != nil {
					return err
				}
				return le.Release(ctx)
			}
		}},
		{"locker", func(key string) func() error {
			ao := &dlock.AcquireOptions{TTL: 30 * time.Second}
			return func() error {
				le, err := l.TryAcquire(ctx, key, ao)
				if err != nil {
					return err
				}
				return le.Release(ctx)
			}
		}},
	}
	for _, cy := range cycles {
		for _, p := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/p%d", cy.name, p), func(b *testing.B) {
				if p == 1 {
					cycle := cy.cycle(newKey())
					for b.Loop() {
						if err := cycle(); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism(max(1, p/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					cycle := cy.cycle(newKey())
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

// BenchmarkHandoff measures contended handoff: 8 goroutines, each with its
// own Locker (as separate processes would have), take turns on one key
// through Locker.Acquire, so every cycle includes waking a waiter.
// handoff-ns is the mean time from a holder's Release returning to another
// goroutine's Acquire returning (the wait a queued process sees, which
// polling designs pay as their retry interval); ping-ns is the mean PING
// round trip on the same server in the same run, for scale; ns/op is the
// cycle time.
func BenchmarkHandoff(b *testing.B) {
	const goroutines = 8
	addr := serverAddr(b)
	lockers := make([]*dlock.Locker, goroutines)
	for i := range lockers {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		l, err := redis.New(b.Context(), c, nil)
		if err != nil {
			b.Fatal(err)
		}
		lockers[i] = l
		b.Cleanup(func() {
			l.Close()
			c.Close()
		})
	}
	key := fmt.Sprintf("bench/handoff/%d", time.Now().UnixNano())
	ao := &dlock.AcquireOptions{TTL: 30 * time.Second}
	var pc goredis.UniversalClient
	if !lockers[0].As(&pc) {
		b.Fatal("Locker.As(*goredis.UniversalClient) = false")
	}
	const pings = 1000
	ping := time.Now()
	for range pings {
		if err := pc.Ping(b.Context()).Err(); err != nil {
			b.Fatal(err)
		}
	}
	pingNs := float64(time.Since(ping).Nanoseconds()) / pings

	type release struct {
		at int64 // UnixNano
		by int   // goroutine
	}
	var (
		next     atomic.Int64 // which Locker the next goroutine takes
		last     atomic.Pointer[release]
		waited   atomic.Int64 // sum of handoff times
		handoffs atomic.Int64
	)
	b.ResetTimer()
	b.SetParallelism(max(1, goroutines/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		me := int(next.Add(1) - 1)
		l := lockers[me%goroutines]
		ctx := context.Background()
		for pb.Next() {
			le, err := l.Acquire(ctx, key, ao)
			if err != nil {
				b.Error(err)
				return
			}
			if r := last.Swap(nil); r != nil && r.by != me {
				waited.Add(time.Now().UnixNano() - r.at)
				handoffs.Add(1)
			}
			if err := le.Release(ctx); err != nil {
				b.Error(err)
				return
			}
			last.Store(&release{time.Now().UnixNano(), me})
		}
	})
	b.ReportMetric(pingNs, "ping-ns")
	if n := handoffs.Load(); n > 0 {
		b.ReportMetric(float64(waited.Load())/float64(n), "handoff-ns")
	}
}
