package redis_test

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/driver"
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
// w=N runs N goroutines (b.SetParallelism(N/GOMAXPROCS)). The names are
// in benchstat's key=value form, so the ratios come out of one command:
//
//	make bench ARGS='-bench Cycle -count 6 ./redis/' | tee /tmp/bench.txt
//	benchstat -col /lib /tmp/bench.txt
func BenchmarkCycle(b *testing.B) {
	c := serverClient(b)
	ctx := b.Context()
	d := newDriver(b, c, nil)
	l, err := driver.New(d, nil) // not closed: closing it would close d twice
	if err != nil {
		b.Fatal(err)
	}
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
				le, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: 30 * time.Second})
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
			b.Run(fmt.Sprintf("lib=%s/w=%d", cy.name, p), func(b *testing.B) {
				defer cpuMetrics(b, c)()
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

// cpuMetrics reports, when the returned function is called at the end of
// a benchmark, the CPU time per op spent by the Redis server (srv-µs/op,
// from INFO cpu, which also counts this function's two INFO calls) and by
// this process (cli-µs/op, from getrusage; it includes the rest of the test
// binary, idle here). On a small machine where client and server share
// the cores, these explain a throughput ratio better than ns/op alone,
// and they are far less noisy.
func cpuMetrics(b *testing.B, c goredis.UniversalClient) func() {
	server := func() float64 {
		info, err := c.Info(b.Context(), "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var sum float64
		for _, line := range strings.Split(info, "\r\n") {
			name, v, _ := strings.Cut(line, ":")
			if name == "used_cpu_sys" || name == "used_cpu_user" {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("INFO cpu: %s: %v", line, err)
				}
				sum += f
			}
		}
		return sum * 1e6 // µs
	}
	client := func() float64 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3 // µs
	}
	srv0, cli0 := server(), client()
	return func() {
		if b.N == 0 || b.Failed() {
			return
		}
		b.ReportMetric((server()-srv0)/float64(b.N), "srv-µs/op")
		b.ReportMetric((client()-cli0)/float64(b.N), "cli-µs/op")
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
	if !driver.LockerAs(lockers[0], &pc) {
		b.Fatal("driver.LockerAs(*goredis.UniversalClient) = false")
	}
	const pings = 1000
	ping := time.Now()
	for range pings {
		if err := pc.Ping(b.Context()).Err(); err != nil {
			b.Fatal(err)
		}
	}
	pingNs := float64(time.Since(ping).Nanoseconds()) / pings

	locks := make([]conformance.LockFunc, goroutines)
	for i, l := range lockers {
		locks[i] = conformance.LockerFunc(l, key, ao)
	}
	conformance.BenchHandoff(b, locks)
	b.ReportMetric(pingNs, "ping-ns")
}
