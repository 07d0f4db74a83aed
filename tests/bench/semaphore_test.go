package bench

// dlock's counting semaphore beside its peers, on the same servers in the
// same run:
//
//	BenchmarkSemaphore/backend=B/hold=H/lib=L
//
// semWorkers workers, each with its own client of the library (as
// separate processes would have: its own connections, and on ZooKeeper
// its own session, for dlock and the peer alike), loop taking one permit
// of a semaphore of semPermits permits on one key, holding it H (0: pure
// grant throughput; 1ms), and giving it back. Reported: permits/s (grants
// per second, all workers together), cli-µs/op (client CPU per grant, the
// whole process), peak-held (the most permits held at once as the workers
// saw them, from acquire's return to release's call; more than semPermits
// fails the benchmark), and the servers' own counters per grant, from
// when every worker's client is open to the last release:
// srv-ops/permit (Redis: commands, a script's inner calls included; etcd:
// gRPC messages received; ZooKeeper: packets received), on etcd and
// ZooKeeper srv-writes/permit (Raft proposals committed; zxids), and
// srv-cpu-µs/permit (see serverStats.cpu).
//
// backend=redis: Redisson's RPermitExpirableSemaphore and RSemaphore, their
// scripts and waiting written again on go-redis (there is no Go library of
// them), and dlock. backend=zookeeper: Curator's InterProcessSemaphoreV2
// written again on go-zookeeper, and dlock. backend=etcd: a naive recipe
// on etcd's concurrency package (it has no semaphore, and no Go library we
// know offers one on etcd), marked as such, and dlock. Redlock serves no
// shared leases.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// The semaphore benchmark's shape: semWorkers workers on a semaphore of
// semPermits permits, each permit held for each of semHolds in turn.
const (
	semWorkers = 16
	semPermits = 4
)

var semHolds = []time.Duration{0, time.Millisecond}

// semBackend is a backend that serves shared leases: its libraries, dlock
// last, and the reader of its servers' counters. A lib's open makes one
// client (one process's connections) and returns the maker of permit
// takers on keys: each lockFunc takes one permit of semPermits on its
// key, blocking until it is granted, and returns its release. libs starts
// the servers.
type semBackend struct {
	name  string
	libs  func(b *testing.B) []lib
	stats func(b *testing.B) func(context.Context) (serverStats, error)
}

var semBackends = []semBackend{
	{"redis", redisSemLibs, func(b *testing.B) func(context.Context) (serverStats, error) {
		return redisStats(b, servers.Redis(b, 1)[0].Addr())
	}},
	{"etcd", etcdSemLibs, func(b *testing.B) func(context.Context) (serverStats, error) {
		return etcdStats(servers.Etcd(b, 1).Members...)
	}},
	{"zookeeper", zkSemLibs, func(b *testing.B) func(context.Context) (serverStats, error) {
		return zkStats(servers.ZooKeeper(b, 1).Members...)
	}},
}

// BenchmarkSemaphore: semWorkers workers, each with its own client, loop
// acquire permit / hold / release on one semaphore of semPermits permits
// (permits/s, cli-µs/op, peak-held, srv-ops/permit, srv-writes/permit,
// srv-cpu-µs/permit).
func BenchmarkSemaphore(b *testing.B) {
	for _, be := range semBackends {
		b.Run("backend="+be.name, func(b *testing.B) {
			libs := be.libs(b)
			stats := be.stats(b)
			for _, hold := range semHolds {
				for _, l := range libs {
					b.Run(fmt.Sprintf("hold=%v/lib=%s", hold, l.name), func(b *testing.B) {
						runSemaphore(b, l, hold, stats)
					})
				}
			}
		})
	}
}

// runSemaphore runs b.N permit cycles of library l among semWorkers
// workers, each with its own client, on a new key, holding each permit
// for hold; stats reads the servers' counters (once every worker's client
// is open, and after the last release).
func runSemaphore(b *testing.B, l lib, hold time.Duration, stats func(context.Context) (serverStats, error)) {
	key := uniqueKey("sem")
	var (
		held, peak atomic.Int64
		before     serverStats
	)
	runCyclesAs(b, semWorkers, "permits/s", func(i int) func() error {
		take := l.open(b)(key)
		if i == semWorkers-1 { // runCyclesAs makes them in order: all are open
			var err error
			if before, err = stats(b.Context()); err != nil {
				b.Fatal(err)
			}
		}
		return func() error {
			ctx := context.Background()
			release, err := take(ctx)
			if err != nil {
				return err
			}
			n := held.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			if hold > 0 {
				time.Sleep(hold)
			}
			held.Add(-1)
			return release(ctx)
		}
	})
	after, err := stats(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	after.sub(before).report(b, b.N, "permit")
	b.ReportMetric(float64(peak.Load()), "peak-held")
	if p := peak.Load(); p > semPermits {
		b.Errorf("%s: %d permits of %d held at once", l.name, p, semPermits)
	}
}

// dlockPermitMaker returns the permit takers of Locker l (Acquire with
// ttl and Permits semPermits, Release), closing l when tb ends.
func dlockPermitMaker(tb testing.TB, l *dlock.Locker, ttl time.Duration) func(string) lockFunc {
	tb.Cleanup(func() { _ = l.Close() })
	ao := &dlock.AcquireOptions{TTL: ttl, Permits: semPermits}
	return func(key string) lockFunc { return conformance.LockerFunc(l, key, ao) }
}

// ---- Redis: Redisson's semaphores on go-redis ----

// Redisson's RPermitExpirableSemaphore (3.x, as of 2024), written again:
// the semaphore NAME is a counter of free permits (set once by
// trySetPermits), "{NAME}:timeout" a sorted set of the permits held (a
// random 16-byte id, scored by its expiry date in Unix ms, computed on the
// client's clock), and "redisson_sc:{NAME}" the channel a release
// publishes the free count on. Each script first gives back the permits
// whose expiry date has passed (that is the only expiry: nothing on the
// server reclaims a permit until someone calls a script).
//
// What it omits, beside dlock: fencing tokens (a permit id is random, so a
// resource cannot reject a holder whose permit expired), a holder
// description, Inspect, automatic refresh (Redisson has updateLeaseTime
// but no watchdog for permits), a check that every holder agrees on N
// (trySetPermits only sets it when the counter does not exist), and any
// order among waiters.

// pesAcquire tries to take permits. KEYS: the counter, the timeout set, the
// channel. ARGV: the number of permits, their expiry date (ms), now (ms),
// the date Redisson gives a permit without expiry, then one id per permit.
// It returns 'OK' when they are taken; else ':DATE', the earliest expiry
// date of the permits held (the waiter wakes then at the latest), or nil
// when no held permit expires.
var pesAcquire = goredis.NewScript(`
local stale = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1])
if #stale > 0 then
	redis.call('zrem', KEYS[2], unpack(stale))
	local freed = redis.call('incrby', KEYS[1], #stale)
	if tonumber(freed) > 0 then
		redis.call('publish', KEYS[3], freed)
	end
end
local free = redis.call('get', KEYS[1])
if free ~= false and tonumber(free) >= tonumber(ARGV[1]) then
	redis.call('decrby', KEYS[1], ARGV[1])
	for i = 5, #ARGV do
		redis.call('zadd', KEYS[2], ARGV[2], ARGV[i])
	end
	local ttl = redis.call('pttl', KEYS[1])
	if ttl > 0 then
		redis.call('pexpire', KEYS[2], ttl)
	end
	return 'OK'
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
if first[1] ~= nil and first[2] ~= ARGV[4] then
	return ':' .. tostring(first[2])
end
return nil`)

// pesRelease gives one permit back. KEYS: the counter, the channel, the
// timeout set. ARGV: the permit's id, 1, now (ms). It returns 1, or 0 if
// the permit was not held (then nothing changes) or had expired by now.
var pesRelease = goredis.NewScript(`
local expiry = redis.call('zscore', KEYS[3], ARGV[1])
if redis.call('zrem', KEYS[3], ARGV[1]) ~= 1 then
	return 0
end
local free = redis.call('incrby', KEYS[1], ARGV[2])
redis.call('publish', KEYS[2], free)
if tonumber(expiry) <= tonumber(ARGV[3]) then
	return 0
end
return 1`)

// Redisson's RSemaphore, written again: NAME is the counter of free
// permits, "redisson_sc:{NAME}" the channel. It has no lease at all: a
// holder that dies keeps its permit for ever (besides what
// RPermitExpirableSemaphore omits). It is here as the floor of what a
// Redis semaphore costs.
var (
	// semAcquire: KEYS: the counter. ARGV: the number of permits. 1 if
	// taken, else 0.
	semAcquire = goredis.NewScript(`
local free = redis.call('get', KEYS[1])
if free ~= false and tonumber(free) >= tonumber(ARGV[1]) then
	redis.call('decrby', KEYS[1], ARGV[1])
	return 1
end
return 0`)
	// semRelease: KEYS: the counter, the channel. ARGV: the number of
	// permits.
	semRelease = goredis.NewScript(`
local free = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], free)
return free`)
	// trySetPermits (both semaphores): KEYS: the counter, the channel.
	// ARGV: N. Sets the counter to N unless it exists; 1 if it did.
	trySetPermits = goredis.NewScript(`
if redis.call('get', KEYS[1]) == false then
	redis.call('set', KEYS[1], ARGV[1])
	redis.call('publish', KEYS[2], ARGV[1])
	return 1
end
return 0`)
)

// redissonNoExpiry is the expiry date Redisson gives a permit acquired
// without a lease time.
const redissonNoExpiry = 922337203685477

// redissonSem is one process's handle of a Redisson semaphore: its client
// and its own pub/sub connection (Redisson has one per process; each
// worker here is a process). lease > 0 makes it an
// RPermitExpirableSemaphore acquiring with that lease time; 0 an
// RSemaphore.
type redissonSem struct {
	c                      *goredis.Client
	ps                     *goredis.PubSub
	name, timeout, channel string
	lease                  time.Duration
}

func newRedissonSem(c *goredis.Client, ps *goredis.PubSub, name string, lease time.Duration) *redissonSem {
	return &redissonSem{c: c, ps: ps, name: name, timeout: "{" + name + "}:timeout", channel: "redisson_sc:{" + name + "}", lease: lease}
}

// try makes one attempt (Redisson's tryAcquire, with new ids and a new
// expiry date each time): the permit's id if taken; else how long to wait
// for a message at most (0: until one comes).
func (s *redissonSem) try(ctx context.Context) (id string, wait time.Duration, err error) {
	if s.lease == 0 {
		got, err := semAcquire.Run(ctx, s.c, []string{s.name}, 1).Int64()
		if err != nil || got == 0 {
			return "", 0, err
		}
		return "-", 0, nil
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id = string(raw[:])
	now := time.Now().UnixMilli()
	res, err := pesAcquire.Run(ctx, s.c, []string{s.name, s.timeout, s.channel},
		1, now+s.lease.Milliseconds(), now, redissonNoExpiry, id).Text()
	switch {
	case errors.Is(err, goredis.Nil):
		return "", 0, nil
	case err != nil:
		return "", 0, err
	case res == "OK":
		return id, 0, nil
	}
	date, err := strconv.ParseInt(strings.TrimPrefix(res, ":"), 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("redisson acquire: reply %q: %w", res, err)
	}
	// A date already passed: try again at once (a wait of 1ns).
	return "", max(time.Duration(date-time.Now().UnixMilli())*time.Millisecond, 1), nil
}

// acquire is Redisson's acquire(leaseTime): one attempt; if it fails,
// subscribe to the channel (waiting for the subscription to be
// confirmed), then attempt, and wait for a release's message (or the
// earliest expiry), until a permit is taken; then unsubscribe. Each
// message wakes the waiter (Redisson releases min(waiters of this
// process, free permits) of its latch: here 1): every waiting process
// tries again on every release.
func (s *redissonSem) acquire(ctx context.Context) (func(context.Context) error, error) {
	id, wait, err := s.try(ctx)
	if err != nil {
		return nil, err
	}
	if id == "" {
		if err := s.subscribe(ctx); err != nil {
			return nil, err
		}
		for {
			if id, wait, err = s.try(ctx); err != nil {
				return nil, err
			}
			if id != "" {
				break
			}
			if err := s.waitMessage(ctx, wait); err != nil {
				return nil, err
			}
		}
		// Redisson unsubscribes without waiting for the reply.
		if err := s.ps.Unsubscribe(ctx, s.channel); err != nil {
			return nil, err
		}
	}
	return func(ctx context.Context) error { return s.release(ctx, id) }, nil
}

// subscribe subscribes to the channel and waits for the confirmation,
// dropping what the connection had received before it (messages of an
// earlier subscription, its unsubscribe's reply): Redisson makes a new
// latch per subscription.
func (s *redissonSem) subscribe(ctx context.Context) error {
	if err := s.ps.Subscribe(ctx, s.channel); err != nil {
		return err
	}
	for {
		msg, err := s.ps.Receive(ctx)
		if err != nil {
			return err
		}
		if sub, ok := msg.(*goredis.Subscription); ok && sub.Kind == "subscribe" && sub.Channel == s.channel {
			return nil
		}
	}
}

// waitMessage waits for a message on the channel, at most wait (0: no
// bound). A message received while the waiter was attempting counts (as a
// latch's permit released then would).
func (s *redissonSem) waitMessage(ctx context.Context, wait time.Duration) error {
	for {
		msg, err := s.ps.ReceiveTimeout(ctx, wait)
		if err != nil {
			var ne net.Error
			if wait > 0 && errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			return err
		}
		if _, ok := msg.(*goredis.Message); ok {
			return nil
		}
	}
}

// release is Redisson's release(permitId) (RSemaphore: release()); an
// RPermitExpirableSemaphore's release of a permit that is no longer held
// fails.
func (s *redissonSem) release(ctx context.Context, id string) error {
	if s.lease == 0 {
		return semRelease.Run(ctx, s.c, []string{s.name, s.channel}, 1).Err()
	}
	ok, err := pesRelease.Run(ctx, s.c, []string{s.name, s.channel, s.timeout}, id, 1, time.Now().UnixMilli()).Int64()
	if err != nil {
		return err
	}
	if ok != 1 {
		return fmt.Errorf("redisson release: permit %s has already been released or has expired", hex.EncodeToString([]byte(id)))
	}
	return nil
}

func redisSemLibs(b *testing.B) []lib {
	addr := servers.Redis(b, 1)[0].Addr()
	redisson := func(lease time.Duration) func(b *testing.B) func(string) lockFunc {
		return func(b *testing.B) func(string) lockFunc {
			c := newRedisClient(b, addr)
			ps := c.Subscribe(b.Context()) // no channel yet: connects on the first
			b.Cleanup(func() { _ = ps.Close() })
			return func(key string) lockFunc {
				s := newRedissonSem(c, ps, "redisson:"+key, lease)
				// Every process calls trySetPermits(N) before acquiring
				// (only the first sets it).
				if err := trySetPermits.Run(b.Context(), c, []string{s.name, s.channel}, semPermits).Err(); err != nil {
					b.Fatal(err)
				}
				return s.acquire
			}
		}
	}
	return []lib{
		// redisson-pes: RPermitExpirableSemaphore, acquire(peerTTL) and
		// release(id).
		{"redisson-pes", redisson(peerTTL)},
		// redisson-sem: RSemaphore, acquire() and release(): no lease.
		{"redisson-sem", redisson(0)},
		{"dlock", func(b *testing.B) func(string) lockFunc {
			l, err := redis.New(b.Context(), newRedisClient(b, addr), &redis.Options{Locker: &dlock.Options{Logger: quiet}})
			if err != nil {
				b.Fatal(err)
			}
			return dlockPermitMaker(b, l, peerTTL)
		}},
	}
}

// ---- ZooKeeper: Curator's InterProcessSemaphoreV2 on go-zookeeper ----

// curatorSem is one process's InterProcessSemaphoreV2(client, PATH,
// maxLeases) (Curator 5), written again on go-zookeeper: an internal
// mutex on PATH/locks serializes the acquirers; its holder creates a
// protected ephemeral sequential lease node PATH/leases/_c_GUID-lease-N,
// lists PATH/leases with a child watch, and while the list has more than
// maxLeases nodes waits for the watch and lists again; then it releases
// the mutex. Releasing a lease deletes its node. The mutex is Curator's
// InterProcessMutex, which go-zookeeper's zk.Lock is a port of (a
// protected ephemeral sequential PATH/locks/_c_GUID-lock-N, a listing, a
// data watch on the predecessor). Each worker has its own connection
// (session), as dlock's workers each have their own Locker.
//
// What it omits, beside dlock: fencing tokens (the lease node's czxid
// could serve, but Curator hands out a Lease without one), a holder
// description (Curator can write node data; it is empty here, as dlock's
// holder is), a check that every holder agrees on maxLeases, and
// cancellation of a waiting acquire (zk.Lock has none; Curator's has a
// timeout).
type curatorSem struct {
	conn   *zk.Conn
	mutex  *zk.Lock
	leases string
	max    int
}

// acquire is Curator's acquire(): the internal mutex, the lease node, the
// wait for the number of leases to come down to maxLeases, the mutex's
// release.
func (s *curatorSem) acquire(ctx context.Context) (func(context.Context) error, error) {
	if err := s.mutex.Lock(); err != nil {
		return nil, err
	}
	path, err := s.waitLease(ctx)
	if uerr := s.mutex.Unlock(); err == nil && uerr != nil {
		_ = s.conn.Delete(path, -1)
		err = uerr
	}
	if err != nil {
		return nil, err
	}
	return func(context.Context) error { return s.conn.Delete(path, -1) }, nil
}

// waitLease creates the lease node and waits until it is one of at most
// max lease nodes; on an error it deletes its node.
func (s *curatorSem) waitLease(ctx context.Context) (string, error) {
	path, err := s.conn.CreateProtectedEphemeralSequential(s.leases+"/lease-", nil, zk.WorldACL(zk.PermAll))
	if err != nil {
		return "", err
	}
	node := path[strings.LastIndexByte(path, '/')+1:]
	for {
		children, _, ch, err := s.conn.ChildrenW(s.leases)
		if err == nil && !slices.Contains(children, node) {
			// Curator retries the whole acquire then (its session
			// expired); no session expires here.
			err = fmt.Errorf("curator semaphore: lease node %s is gone", path)
		}
		if err != nil {
			_ = s.conn.Delete(path, -1)
			return "", err
		}
		if len(children) <= s.max {
			return path, nil
		}
		select {
		case ev := <-ch:
			if ev.Err != nil {
				_ = s.conn.Delete(path, -1)
				return "", ev.Err
			}
		case <-ctx.Done():
			_ = s.conn.Delete(path, -1)
			return "", ctx.Err()
		}
	}
}

// zkCreatePath creates path and its parents (persistent, empty) unless
// they exist, as Curator's creatingParentContainersIfNeeded does once.
func zkCreatePath(conn *zk.Conn, path string) error {
	for i := 1; i <= len(path); i++ {
		if i == len(path) || path[i] == '/' {
			if _, err := conn.Create(path[:i], nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return err
			}
		}
	}
	return nil
}

func zkSemLibs(b *testing.B) []lib {
	srv := servers.ZooKeeper(b, 1).Servers()
	return []lib{
		{"curator", func(b *testing.B) func(string) lockFunc {
			conn := newZKConn(b, srv)
			return func(key string) lockFunc {
				base := "/curator/" + key
				if err := zkCreatePath(conn, base+"/leases"); err != nil {
					b.Fatal(err)
				}
				s := &curatorSem{conn: conn, mutex: zk.NewLock(conn, base+"/locks", zk.WorldACL(zk.PermAll)), leases: base + "/leases", max: semPermits}
				return s.acquire
			}
		}},
		{"dlock", func(b *testing.B) func(string) lockFunc {
			l, err := zookeeper.New(b.Context(), srv, &zookeeper.Options{SessionTimeout: zkSession, Locker: &dlock.Options{Logger: quiet}})
			if err != nil {
				b.Fatal(err)
			}
			return dlockPermitMaker(b, l, zkTTL)
		}},
	}
}

// ---- etcd: a naive recipe on concurrency, and dlock ----

// naiveEtcdSem is a naive semaphore recipe on etcd's concurrency package,
// not a library (etcd has no semaphore): Curator's InterProcessSemaphoreV2
// done on etcd. A concurrency.Mutex on PATH/lock serializes the acquirers;
// its holder puts PATH/leases/ID on its Session's lease, counts
// PATH/leases/, and while the count is over N watches the prefix for a
// delete from the count's revision + 1 and counts again; then it unlocks.
// Releasing deletes the key. Each worker has its own client and one
// Session, reused for every permit (as mutex-reused does).
//
// What it omits, beside dlock: fencing tokens (the lease key's create
// revision could serve; nothing hands it out), loss detection (a Session's
// lease could be lost without the holder knowing until Done), a holder
// description, a check that every holder agrees on N.
type naiveEtcdSem struct {
	c      *clientv3.Client
	mutex  *concurrency.Mutex
	leases string
	mine   string
	max    int64
	lease  clientv3.LeaseID
}

func (s *naiveEtcdSem) acquire(ctx context.Context) (func(context.Context) error, error) {
	if err := s.mutex.Lock(ctx); err != nil {
		return nil, err
	}
	err := s.waitLease(ctx)
	if uerr := s.mutex.Unlock(context.WithoutCancel(ctx)); err == nil && uerr != nil {
		err = uerr
	}
	if err != nil {
		_, _ = s.c.Delete(context.WithoutCancel(ctx), s.mine)
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := s.c.Delete(ctx, s.mine)
		return err
	}, nil
}

// waitLease puts the worker's lease key and waits until at most max lease
// keys exist.
func (s *naiveEtcdSem) waitLease(ctx context.Context) error {
	if _, err := s.c.Put(ctx, s.mine, "", clientv3.WithLease(s.lease)); err != nil {
		return err
	}
	for {
		resp, err := s.c.Get(ctx, s.leases, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if resp.Count <= s.max {
			return nil
		}
		wctx, cancel := context.WithCancel(ctx)
		wch := s.c.Watch(clientv3.WithRequireLeader(wctx), s.leases, clientv3.WithPrefix(),
			clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut())
		var werr error
		for wr := range wch {
			if werr = wr.Err(); werr != nil || len(wr.Events) > 0 {
				break
			}
		}
		cancel()
		if werr != nil {
			return werr
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

func etcdSemLibs(b *testing.B) []lib {
	eps := servers.Etcd(b, 1).Endpoints()
	return []lib{
		{"naive", func(b *testing.B) func(string) lockFunc {
			c := newEtcdClient(b, eps)
			s, err := concurrency.NewSession(c, concurrency.WithTTL(int(peerTTL/time.Second)))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			return func(key string) lockFunc {
				base := "naive/" + key
				sem := &naiveEtcdSem{c: c, mutex: concurrency.NewMutex(s, base+"/lock"), leases: base + "/leases/",
					max: semPermits, lease: s.Lease()}
				sem.mine = fmt.Sprintf("%s%x", sem.leases, s.Lease())
				return sem.acquire
			}
		}},
		{"dlock", func(b *testing.B) func(string) lockFunc {
			l, err := etcd.New(b.Context(), newEtcdClient(b, eps), &etcd.Options{Locker: &dlock.Options{Logger: quiet}})
			if err != nil {
				b.Fatal(err)
			}
			return dlockPermitMaker(b, l, peerTTL)
		}},
	}
}
