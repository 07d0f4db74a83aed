package zookeeper_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/tests/servers"
)

// BenchmarkCycle measures one uncontended lock cycle, each goroutine on its
// own key, on a standalone server, beside go-zookeeper's zk.Lock (one
// session for all goroutines in both cases):
//
//	lib=zklock  zk.NewLock(conn, path, acl): Lock + Unlock
//	lib=dlock   dlock Locker.Acquire + Lease.Release
//
//	make bench ARGS='-bench Cycle -count 6 ./tests/zookeeper/' | tee /tmp/zk.txt
//	benchstat -col /lib /tmp/zk.txt
func BenchmarkCycle(b *testing.B) {
	srv := servers.ZooKeeper(b, 1).Servers()
	conn := adminConn(b, srv)
	l := newLocker(b, srv, nil)
	ctx := b.Context()
	var seq atomic.Int64
	newKey := func() string { return fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), seq.Add(1)) }
	if _, err := conn.Create("/zklock", nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
		b.Fatal(err)
	}
	cycles := []struct {
		name  string
		cycle func(key string) func() error
	}{
		{"zklock", func(key string) func() error {
			m := zk.NewLock(conn, "/zklock/"+key, zk.WorldACL(zk.PermAll))
			return func() error {
				if err := m.Lock(); err != nil {
					return err
				}
				return m.Unlock()
			}
		}},
		{"dlock", func(key string) func() error {
			ao := &dlock.AcquireOptions{TTL: 30 * time.Second}
			return func() error {
				le, err := l.Acquire(ctx, key, ao)
				if err != nil {
					return err
				}
				return le.Release(ctx)
			}
		}},
	}
	for _, cy := range cycles {
		for _, p := range []int{1, 16} {
			b.Run(fmt.Sprintf("lib=%s/p=%d", cy.name, p), func(b *testing.B) {
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

// BenchmarkHandoff measures contended handoff on one key
// (conformance.BenchHandoff: 8 goroutines, each with its own session):
//
//	lib=zklock  zk.NewLock on its own connection
//	lib=dlock   dlock Locker.Acquire
func BenchmarkHandoff(b *testing.B) {
	const goroutines = 8
	srv := servers.ZooKeeper(b, 1).Servers()
	makers := []struct {
		name string
		make func(b *testing.B, key string) conformance.LockFunc
	}{
		{"zklock", func(b *testing.B, key string) conformance.LockFunc {
			m := zk.NewLock(adminConn(b, srv), "/zklock/"+key, zk.WorldACL(zk.PermAll))
			return func(context.Context) (func(context.Context) error, error) {
				return func(context.Context) error { return m.Unlock() }, m.Lock()
			}
		}},
		{"dlock", func(b *testing.B, key string) conformance.LockFunc {
			l := newLocker(b, srv, nil)
			ao := &dlock.AcquireOptions{TTL: 30 * time.Second}
			return conformance.LockerFunc(l, key, ao)
		}},
	}
	for _, mk := range makers {
		b.Run("lib="+mk.name, func(b *testing.B) {
			key := fmt.Sprintf("handoff-%d", time.Now().UnixNano())
			locks := make([]conformance.LockFunc, goroutines)
			for i := range locks {
				locks[i] = mk.make(b, key)
			}
			conformance.BenchHandoff(b, locks)
		})
	}
}
