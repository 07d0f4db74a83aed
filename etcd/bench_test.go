package etcd_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/conformance/servers"
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
			b.Run(fmt.Sprintf("%s/p%d", cy.name, p), func(b *testing.B) {
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

// BenchmarkHandoff measures contended handoff on one key
// (conformance.BenchHandoff: 8 goroutines, each with its own client):
//
//	mutex   concurrency.Mutex, one Session per goroutine
//	locker  dlock Locker.Acquire (predecessor watch from the header
//	        revision + 1)
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
		b.Run(mk.name, func(b *testing.B) {
			key := fmt.Sprintf("bench/handoff/%d", time.Now().UnixNano())
			locks := make([]conformance.LockFunc, goroutines)
			for i := range locks {
				locks[i] = mk.make(b, key)
			}
			conformance.BenchHandoff(b, locks)
		})
	}
}
