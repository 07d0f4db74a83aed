package bench

// dlock beside its peers, on the same servers in the same run:
//
//	BenchmarkCycle/backend=B/w=W/lib=L    uncontended cycles, W workers, each its own key
//	                                      (w=16c: and each its own client)
//	BenchmarkHandoff/backend=B/lib=L      8 workers on one key, hold 0
//
// backend=redis (one server): raw go-redis, bsm/redislock, redsync (1
// pool), dlock. backend=redlock (five servers): redsync (5 pools), dlock.
// backend=etcd (a single-member cluster): concurrency.Mutex on a reused
// Session, concurrency.Mutex with a Session per lock, dlock.
// backend=zookeeper (a standalone server): go-zookeeper zk.Lock, dlock.
// backend=etcd3 and backend=zookeeper3: the same on a 3-member cluster
// and a 3-server ensemble (every client of a library given every
// member; a write is then a quorum's).
// `benchstat -col /lib` puts the libraries of a backend side by side; see
// run.sh for the per-pair tables (peer as the base column).

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// lockFunc takes a lock, blocking until it is held, and returns its
// release.
type lockFunc = conformance.LockFunc

// peerTTL is the lease time every library asks for in the peer
// benchmarks (ZooKeeper: zkTTL, within the TTL bound of its session,
// 30s - 30s/3 - the default 2s tick = 18s).
const (
	peerTTL   = 30 * time.Second
	zkSession = 30 * time.Second
	zkTTL     = 15 * time.Second
)

// lib is one library on one backend. open makes one client of it (its own
// connections, as one process would have) and returns the maker of
// lockFuncs on keys through that client; the cycle benchmark opens one per
// library and gives each worker a key of its own, the handoff benchmark
// opens one per worker, all on one key.
type lib struct {
	name string
	open func(b *testing.B) func(key string) lockFunc
}

// backendLibs is a backend and its libraries, dlock last; libs starts the
// servers, stats reads their counters (see serverStats).
type backendLibs struct {
	name  string
	libs  func(b *testing.B) []lib
	stats func(b *testing.B) func(context.Context) (serverStats, error)
}

var peerBackends = []backendLibs{
	{"redis", redisLibs, func(b *testing.B) func(context.Context) (serverStats, error) {
		return redisStats(b, servers.Redis(b, 1)[0].Addr())
	}},
	{"redlock", redlockLibs, func(b *testing.B) func(context.Context) (serverStats, error) {
		var as []string
		for _, s := range servers.Redis(b, 5) {
			as = append(as, s.Addr())
		}
		return redisStats(b, as...)
	}},
	{"etcd", func(b *testing.B) []lib { return etcdLibs(b, 1) }, func(b *testing.B) func(context.Context) (serverStats, error) {
		return etcdStats(servers.Etcd(b, 1).Members...)
	}},
	{"zookeeper", func(b *testing.B) []lib { return zkLibs(b, 1) }, func(b *testing.B) func(context.Context) (serverStats, error) {
		return zkStats(servers.ZooKeeper(b, 1).Members...)
	}},
	{"etcd3", func(b *testing.B) []lib { return etcdLibs(b, 3) }, func(b *testing.B) func(context.Context) (serverStats, error) {
		return etcdStats(servers.Etcd(b, 3).Members...)
	}},
	{"zookeeper3", func(b *testing.B) []lib { return zkLibs(b, 3) }, func(b *testing.B) func(context.Context) (serverStats, error) {
		return zkStats(servers.ZooKeeper(b, 3).Members...)
	}},
}

// cycleShapes are BenchmarkCycle's worker shapes: w=1 and w=16 share one
// client of the library (one process with 16 goroutines), w=16c gives
// each of its 16 workers a client of its own (16 processes: on ZooKeeper
// a session each, on Redis and etcd connections of their own).
var cycleShapes = []struct {
	name             string
	workers, clients int
}{{"1", 1, 1}, {"16", 16, 1}, {"16c", 16, 16}}

// BenchmarkCycle: one uncontended lock cycle (acquire + release, through
// each library's blocking acquire), with 1 and 16 workers sharing one
// client of the library and 16 workers with a client each (see
// cycleShapes), each worker on its own key; with the servers'
// work per cycle (srv-ops/op, srv-cpu-µs/op, and srv-writes/op where the
// backend tells, see serverStats; other clients' work on the same
// servers meanwhile counts too, and a Locker's background work).
func BenchmarkCycle(b *testing.B) {
	for _, be := range peerBackends {
		b.Run("backend="+be.name, func(b *testing.B) {
			libs := be.libs(b)
			stats := be.stats(b)
			for _, sh := range cycleShapes {
				for _, l := range libs {
					b.Run(fmt.Sprintf("w=%s/lib=%s", sh.name, l.name), func(b *testing.B) {
						// The clients (closed by b's cleanup, after each
						// round of b.N).
						mks := make([]func(key string) lockFunc, sh.clients)
						for i := range mks {
							mks[i] = l.open(b)
						}
						before, err := stats(b.Context())
						if err != nil {
							b.Fatal(err)
						}
						defer func() {
							after, err := stats(b.Context())
							if err != nil {
								b.Fatal(err)
							}
							after.sub(before).report(b, b.N, "op")
						}()
						runCycles(b, sh.workers, func(i int) func() error {
							lock := mks[i%len(mks)](uniqueKey("cycle"))
							return func() error {
								unlock, err := lock(context.Background())
								if err != nil {
									return err
								}
								return unlock(context.Background())
							}
						})
					})
				}
			}
		})
	}
}

// handoffWorkers is the number of contenders of BenchmarkHandoff.
const handoffWorkers = 8

// BenchmarkHandoff: handoffWorkers workers, each with its own client of the
// library, take turns on one key with hold 0 (runHandoff: cycles/s, wait
// p50-ms/p99-ms, spread).
func BenchmarkHandoff(b *testing.B) {
	for _, be := range peerBackends {
		b.Run("backend="+be.name, func(b *testing.B) {
			libs := be.libs(b)
			for _, l := range libs {
				b.Run("lib="+l.name, func(b *testing.B) {
					key := uniqueKey("handoff")
					locks := make([]lockFunc, handoffWorkers)
					for i := range locks {
						locks[i] = l.open(b)(key)
					}
					runHandoff(b, locks)
				})
			}
		})
	}
}

var keySeq atomic.Int64

// uniqueKey returns a key no other benchmark (or earlier run) uses.
func uniqueKey(what string) string {
	return fmt.Sprintf("bench-%s-%d-%d", what, time.Now().UnixNano(), keySeq.Add(1))
}

// quiet is the logger of the dlock Lockers and the ZooKeeper clients:
// warnings would interleave with the benchmark output.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type zkNopLogger struct{}

func (zkNopLogger) Printf(string, ...any) {}

// newRedisClient returns a go-redis client of addr with default options
// but ContextTimeoutEnabled (which the redlock backend requires),
// closed when tb ends.
func newRedisClient(tb testing.TB, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// rawRelease is the compare-and-delete of the raw go-redis loop.
var rawRelease = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// redsyncLock is redsync's lock on key: a Mutex per lock, retrying (its
// default 50-250 ms random delay) until it is granted.
func redsyncLock(rs *redsync.Redsync, key string) lockFunc {
	return func(ctx context.Context) (func(context.Context) error, error) {
		m := rs.NewMutex(key, redsync.WithExpiry(peerTTL), redsync.WithTries(1<<30))
		if err := m.LockContext(ctx); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			if ok, err := m.UnlockContext(ctx); err != nil || !ok {
				return fmt.Errorf("redsync unlock: %v, %w", ok, err)
			}
			return nil
		}, nil
	}
}

// dlockMaker returns the lockFuncs of Locker l (Acquire with peerTTL or
// ttl, Release), closing l when tb ends.
func dlockMaker(tb testing.TB, l *dlock.Locker, ttl time.Duration) func(string) lockFunc {
	tb.Cleanup(func() { _ = l.Close() })
	ao := &dlock.AcquireOptions{TTL: ttl}
	return func(key string) lockFunc { return conformance.LockerFunc(l, key, ao) }
}

func redisLibs(b *testing.B) []lib {
	addr := servers.Redis(b, 1)[0].Addr()
	return []lib{
		// raw: SET key val NX PX, then EVALSHA compare-and-delete (two
		// round trips, nothing else: the ceiling of a Redis lock). A
		// waiter polls SET NX every 5-10 ms.
		{"raw", func(b *testing.B) func(string) lockFunc {
			c := newRedisClient(b, addr)
			if err := rawRelease.Load(b.Context(), c).Err(); err != nil {
				b.Fatal(err)
			}
			return func(key string) lockFunc {
				k := "raw:" + key
				val := fmt.Sprintf("owner-%d", keySeq.Add(1))
				release := func(ctx context.Context) error {
					n, err := rawRelease.Run(ctx, c, []string{k}, val).Int64()
					if err != nil || n != 1 {
						return fmt.Errorf("raw release: %v, %w", n, err)
					}
					return nil
				}
				return func(ctx context.Context) (func(context.Context) error, error) {
					for {
						ok, err := c.SetNX(ctx, k, val, peerTTL).Result()
						if err != nil {
							return nil, err
						}
						if ok {
							return release, nil
						}
						select {
						case <-ctx.Done():
							return nil, ctx.Err()
						case <-time.After(5*time.Millisecond + rand.N(5*time.Millisecond)):
						}
					}
				}
			}
		}},
		// redislock: Obtain (its script) + Release; a waiter retries
		// with its ExponentialBackoff from 16 ms (the minimum its doc
		// recommends) to 500 ms (dlock's default RetryMax).
		{"redislock", func(b *testing.B) func(string) lockFunc {
			rl := redislock.New(newRedisClient(b, addr))
			return func(key string) lockFunc {
				k := "redislock:" + key
				return func(ctx context.Context) (func(context.Context) error, error) {
					lk, err := rl.Obtain(ctx, k, peerTTL, &redislock.Options{
						RetryStrategy: redislock.ExponentialBackoff(16*time.Millisecond, 500*time.Millisecond),
					})
					if err != nil {
						return nil, err
					}
					return lk.Release, nil
				}
			}
		}},
		{"redsync", func(b *testing.B) func(string) lockFunc {
			rs := redsync.New(rsgoredis.NewPool(newRedisClient(b, addr)))
			return func(key string) lockFunc { return redsyncLock(rs, "redsync:"+key) }
		}},
		{"dlock", func(b *testing.B) func(string) lockFunc {
			l, err := redis.New(b.Context(), newRedisClient(b, addr), &redis.Options{Locker: &dlock.Options{Logger: quiet}})
			if err != nil {
				b.Fatal(err)
			}
			return dlockMaker(b, l, peerTTL)
		}},
	}
}

// fiveRedis returns one new client per Redis server of the five shared
// ones, closed when tb ends.
func fiveRedis(tb testing.TB) []goredis.UniversalClient {
	var cs []goredis.UniversalClient
	for _, s := range servers.Redis(tb, 5) {
		cs = append(cs, newRedisClient(tb, s.Addr()))
	}
	return cs
}

func redlockLibs(b *testing.B) []lib {
	servers.Redis(b, 5) // start them now, not in a timed run
	return []lib{
		{"redsync", func(b *testing.B) func(string) lockFunc {
			var pools []redsyncredis.Pool
			for _, c := range fiveRedis(b) {
				pools = append(pools, rsgoredis.NewPool(c))
			}
			rs := redsync.New(pools...)
			return func(key string) lockFunc { return redsyncLock(rs, "redsync:"+key) }
		}},
		{"dlock", func(b *testing.B) func(string) lockFunc {
			l, err := redlock.New(b.Context(), fiveRedis(b), &redlock.Options{Locker: &dlock.Options{Logger: quiet}})
			if err != nil {
				b.Fatal(err)
			}
			return dlockMaker(b, l, peerTTL)
		}},
	}
}

// newEtcdClient returns a client of endpoints (its retry warnings
// silenced), closed when tb ends.
func newEtcdClient(tb testing.TB, endpoints []string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// etcdLibs: the etcd libraries on the shared etcd cluster of n members.
func etcdLibs(b *testing.B, n int) []lib {
	eps := servers.Etcd(b, n).Endpoints()
	ttl := int(peerTTL / time.Second)
	return []lib{
		// mutex-reused: one long-lived Session per worker (every lock
		// of the worker shares its lease): Lock + Unlock.
		{"mutex-reused", func(b *testing.B) func(string) lockFunc {
			c := newEtcdClient(b, eps)
			return func(key string) lockFunc {
				s, err := concurrency.NewSession(c, concurrency.WithTTL(ttl))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = s.Close() })
				m := concurrency.NewMutex(s, "mutex/"+key)
				return func(ctx context.Context) (func(context.Context) error, error) {
					if err := m.Lock(ctx); err != nil {
						return nil, err
					}
					return m.Unlock, nil
				}
			}
		}},
		// mutex-session: the tutorial recipe, a lease per lock as
		// dlock has: NewSession + Lock, then Unlock + Session.Close.
		{"mutex-session", func(b *testing.B) func(string) lockFunc {
			c := newEtcdClient(b, eps)
			return func(key string) lockFunc {
				return func(ctx context.Context) (func(context.Context) error, error) {
					s, err := concurrency.NewSession(c, concurrency.WithTTL(ttl))
					if err != nil {
						return nil, err
					}
					m := concurrency.NewMutex(s, "mutex/"+key)
					if err := m.Lock(ctx); err != nil {
						_ = s.Close()
						return nil, err
					}
					return func(ctx context.Context) error {
						err := m.Unlock(ctx)
						if cerr := s.Close(); err == nil {
							err = cerr
						}
						return err
					}, nil
				}
			}
		}},
		{"dlock", func(b *testing.B) func(string) lockFunc {
			l, err := etcd.New(b.Context(), newEtcdClient(b, eps), &etcd.Options{Locker: &dlock.Options{Logger: quiet}})
			if err != nil {
				b.Fatal(err)
			}
			return dlockMaker(b, l, peerTTL)
		}},
	}
}

// newZKConn returns a go-zookeeper connection with a session, closed when
// tb ends.
func newZKConn(tb testing.TB, srv []string) *zk.Conn {
	c, _, err := zk.Connect(srv, zkSession, zk.WithLogInfo(false), zk.WithLogger(zkNopLogger{}))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	if _, _, err := c.Exists("/"); err != nil { // waits for the session
		tb.Fatal(err)
	}
	return c
}

// zkLibs: the ZooKeeper libraries on the shared ensemble of n servers.
func zkLibs(b *testing.B, n int) []lib {
	srv := servers.ZooKeeper(b, n).Servers()
	if _, err := newZKConn(b, srv).Create("/zklock", nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
		b.Fatal(err)
	}
	return []lib{
		// zklock: zk.NewLock(conn, path, acl), Lock + Unlock, one Lock
		// per worker.
		{"zklock", func(b *testing.B) func(string) lockFunc {
			conn := newZKConn(b, srv)
			return func(key string) lockFunc {
				m := zk.NewLock(conn, "/zklock/"+key, zk.WorldACL(zk.PermAll))
				unlock := func(context.Context) error { return m.Unlock() }
				return func(context.Context) (func(context.Context) error, error) {
					if err := m.Lock(); err != nil {
						return nil, err
					}
					return unlock, nil
				}
			}
		}},
		{"dlock", func(b *testing.B) func(string) lockFunc {
			l, err := zookeeper.New(b.Context(), srv, &zookeeper.Options{SessionTimeout: zkSession, Locker: &dlock.Options{Logger: quiet}})
			if err != nil {
				b.Fatal(err)
			}
			return dlockMaker(b, l, zkTTL)
		}},
	}
}
