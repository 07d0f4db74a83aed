package matrix_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// The backends, as the matrix's columns.
const (
	bRedis     = "Redis"
	bRedlock   = "Redlock"
	bEtcd      = "etcd"
	bZooKeeper = "ZooKeeper"
)

// backend is one column: how to start its servers.
type backend struct {
	name  string
	nodes int // servers in a deployment
	start func(t *testing.T, o deployOptions) *deployment
}

// deployOptions varies a deployment for a scenario.
type deployOptions struct {
	// redisArgs are extra redis-server arguments (Redis and Redlock), e.g.
	// persistence settings.
	redisArgs []string
	// faketime runs the Redis servers under libfaketime, so that
	// Server.ShiftClock can move their clocks (Redis and Redlock).
	faketime bool
	// sessionTimeout is the ZooKeeper session timeout the URL asks for
	// (default zkSession); a ZooKeeper lease's TTL is at most two thirds
	// of it less a tick (zkTick).
	sessionTimeout time.Duration
}

// zkSession is the default ZooKeeper session timeout of the matrix: it
// bounds how long a dead holder keeps the key. 6.3s keeps cells short and
// leases of victimTTL (4s, the same on every backend) within the TTL bound
// of the session, zkSession - zkSession/3 - zkTick = 4s, exactly.
const zkSession = 6300 * time.Millisecond

// zkTick is the test servers' tickTime, passed to the ZooKeeper backend
// as tick_time: it enters the bound on TTLs.
const zkTick = servers.ZooKeeperTick

// deployment is a running set of servers for one cell.
type deployment struct {
	servers []*servers.Server // every node, in the order of addrs
	// url returns the dlock.Open URL over addrs (one per server).
	url func(addrs []string) string
	// leader returns the server whose crash matters most: the only Redis,
	// Redlock's first node, the etcd or ZooKeeper leader (found by asking
	// the servers, never assumed).
	leader func(ctx context.Context) (*servers.Server, error)
	// etcd is an admin client of an etcd deployment (nil for the others),
	// closed when the cell ends.
	etcd *clientv3.Client
	// expire makes the servers drop the lock held on key now, as an
	// expiry would. It reports whether a lock was dropped and, if it can
	// tell, its token (else 0: then the checker assumes any lease pending
	// at the time may have been the one).
	expire func(ctx context.Context, key string) (dropped bool, token dlock.Token, err error)
}

// addrs returns the servers' addresses.
func (d *deployment) addrs() []string {
	var as []string
	for _, s := range d.servers {
		as = append(as, s.Addr())
	}
	return as
}

var backends = []*backend{
	{name: bRedis, nodes: 1, start: func(t *testing.T, o deployOptions) *deployment {
		ss := startRedis(t, 1, o)
		return &deployment{
			servers: ss,
			url:     func(a []string) string { return "redis://" + a[0] },
			leader:  func(context.Context) (*servers.Server, error) { return ss[0], nil },
			expire:  redisExpire(t, ss, redis.DefaultPrefix, true),
		}
	}},
	{name: bRedlock, nodes: 5, start: func(t *testing.T, o deployOptions) *deployment {
		ss := startRedis(t, 5, o)
		return &deployment{
			servers: ss,
			// node_timeout 200ms, not the default 50ms: on a loaded
			// 2-core machine under -race a round trip misses 50ms (or a
			// release's 100ms) with no fault injected, and that refusal
			// would fail a cell for nothing the scenario did. A tenth of
			// env.ttl, still far below every injected delay.
			url:    func(a []string) string { return "redlock://" + strings.Join(a, ",") + "?node_timeout=200ms" },
			leader: func(context.Context) (*servers.Server, error) { return ss[0], nil },
			expire: redisExpire(t, ss, redlock.DefaultPrefix, false),
		}
	}},
	{name: bEtcd, nodes: 3, start: func(t *testing.T, _ deployOptions) *deployment {
		c, err := servers.StartEtcd(t.Context(), 3)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Terminate(context.WithoutCancel(t.Context())) })
		admin, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Close() })
		return &deployment{
			servers: c.Members,
			etcd:    admin,
			url:     func(a []string) string { return "etcd://" + strings.Join(a, ",") },
			leader: func(ctx context.Context) (*servers.Server, error) {
				return awaitLeader(ctx, c.Members, func(ctx context.Context, s *servers.Server) (bool, error) {
					st, err := admin.Status(ctx, s.Addr())
					if err != nil {
						return false, err
					}
					return st.Header.MemberId == st.Leader, nil
				})
			},
			expire: func(ctx context.Context, key string) (bool, dlock.Token, error) {
				// Delete the holder's entry (the one of the key's
				// queue with the lowest create revision, which is its
				// token), as the server does when its lease runs out,
				// if it is still there on the lease read. Not a revoke
				// of that lease: the holder may have released the key
				// since the read, and its Locker reuses a released
				// lease for its next grant (the lease pool), so a
				// revoke would drop another key's lock. Waiters stay
				// queued.
				dir := etcd.DefaultPrefix + strings.NewReplacer("%", "%25", "/", "%2F").Replace(key) + "/"
				resp, err := admin.Get(ctx, dir, clientv3.WithFirstCreate()...)
				if err != nil || len(resp.Kvs) == 0 {
					return false, 0, err
				}
				kv := resp.Kvs[0]
				k := string(kv.Key)
				tr, err := admin.Txn(ctx).
					If(clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision),
						clientv3.Compare(clientv3.LeaseValue(k), "=", clientv3.LeaseID(kv.Lease))).
					Then(clientv3.OpDelete(k)).
					Commit()
				if err != nil {
					return false, 0, err
				}
				if !tr.Succeeded {
					return false, 0, nil // released (or moved by a refresh) since the read
				}
				return true, dlock.Token(kv.CreateRevision), nil
			},
		}
	}},
	{name: bZooKeeper, nodes: 3, start: func(t *testing.T, o deployOptions) *deployment {
		e, err := servers.StartZooKeeper(t.Context(), 3)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Terminate(context.WithoutCancel(t.Context())) })
		admin, _, err := zk.Connect(e.Servers(), 10*time.Second, zk.WithLogger(zkQuiet{}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(admin.Close)
		return &deployment{
			servers: e.Members,
			url: func(a []string) string {
				return "zk://" + strings.Join(a, ",") + "?session_timeout=" + cmp.Or(o.sessionTimeout, zkSession).String() + "&tick_time=" + zkTick.String()
			},
			leader: func(ctx context.Context) (*servers.Server, error) {
				return awaitLeader(ctx, e.Members, func(_ context.Context, s *servers.Server) (bool, error) {
					mode, _, err := zkState(s.Addr())
					return mode == "leader", err
				})
			},
			expire: func(ctx context.Context, key string) (bool, dlock.Token, error) {
				// Delete the holder's node: the one of the key's queue
				// created first (lowest czxid, which is its token).
				// Waiters stay queued. Matrix keys need no encoding.
				parent := zookeeper.DefaultPrefix + "/" + key
				kids, _, err := admin.Children(parent)
				if errors.Is(err, zk.ErrNoNode) {
					return false, 0, nil
				}
				if err != nil {
					return false, 0, err
				}
				var head string
				var czxid int64
				for _, k := range kids {
					ok, st, err := admin.Exists(parent + "/" + k)
					if err != nil {
						return false, 0, err
					}
					if ok && (head == "" || st.Czxid < czxid) {
						head, czxid = k, st.Czxid
					}
				}
				if head == "" {
					return false, 0, nil
				}
				if err := admin.Delete(parent+"/"+head, -1); err != nil {
					if errors.Is(err, zk.ErrNoNode) {
						return false, 0, nil // released since the read
					}
					return false, 0, err
				}
				return true, dlock.Token(czxid), nil
			},
		}
	}},
}

// startRedis starts n Redis servers for one cell, terminated when it ends.
func startRedis(t *testing.T, n int, o deployOptions) []*servers.Server {
	t.Helper()
	var (
		ss  []*servers.Server
		err error
	)
	if o.faketime {
		ss, err = servers.StartRedisFaketime(t.Context(), n, o.redisArgs...)
	} else {
		ss, err = servers.StartRedisWithArgs(t.Context(), n, o.redisArgs...)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		t.Cleanup(func() { _ = s.Terminate(context.WithoutCancel(t.Context())) })
	}
	return ss
}

// dropLock deletes a Redis lock key (KEYS[1]) and, if there was one,
// returns its fencing counter (KEYS[2]); else ”. On a single server the
// counter holds the token of the last grant, which is the holder's.
var dropLock = goredis.NewScript(`
if redis.call('DEL', KEYS[1]) == 1 then
	return redis.call('GET', KEYS[2]) or '0'
end
return ''`)

// redisExpire deletes the lock key of key (under prefix) on every server.
// With tokens (a single server) it returns the token of the lock dropped;
// on Redlock's nodes it cannot tell (a node's counter may be below the
// token, or above it from another client's failed attempt), and returns 0.
func redisExpire(t *testing.T, ss []*servers.Server, prefix string, tokens bool) func(context.Context, string) (bool, dlock.Token, error) {
	var cs []*goredis.Client
	for _, s := range ss {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	return func(ctx context.Context, key string) (bool, dlock.Token, error) {
		lock := prefix + "{" + key + "}"
		var (
			errs    []error
			dropped bool
			token   dlock.Token
		)
		for _, c := range cs {
			v, err := dropLock.Run(ctx, c, []string{lock, lock + redisscript.FenceSuffix}).Text()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if v == "" {
				continue // no lock on this server
			}
			dropped = true
			n, err := redisCounter(v)
			if err != nil {
				errs = append(errs, err)
			}
			token = dlock.Token(n)
		}
		if !tokens {
			token = 0
		}
		return dropped, token, errors.Join(errs...)
	}
}

// awaitLeader polls the servers until exactly one says it leads (servers
// that do not answer, such as a killed one, are skipped) and returns it.
func awaitLeader(ctx context.Context, ss []*servers.Server, leads func(context.Context, *servers.Server) (bool, error)) (*servers.Server, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		var found []*servers.Server
		for _, s := range ss {
			sctx, scancel := context.WithTimeout(ctx, time.Second)
			ok, err := leads(sctx, s)
			scancel()
			if err != nil {
				last = err
			}
			if ok {
				found = append(found, s)
			}
		}
		if len(found) == 1 {
			return found[0], nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no single leader among %d servers: %w (last error: %v)", len(ss), ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// zkFourLetter sends the four-letter word cmd to the ZooKeeper server at
// addr and returns its answer.
func zkFourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	out, err := io.ReadAll(c)
	return string(out), err
}

// zkState asks the ZooKeeper server at addr (four-letter word srvr)
// for its mode and the epoch of its last zxid (its high 32 bits: the
// leader's term).
func zkState(addr string) (mode string, epoch uint64, err error) {
	out, err := zkFourLetter(addr, "srvr")
	if err != nil {
		return "", 0, err
	}
	var zxid string
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(line, "Mode: "); ok {
			mode = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "Zxid: "); ok {
			zxid = strings.TrimSpace(v)
		}
	}
	if mode == "" || zxid == "" {
		return "", 0, fmt.Errorf("srvr on %s: no mode or zxid in %q", addr, out)
	}
	z, err := strconv.ParseUint(strings.TrimPrefix(zxid, "0x"), 16, 64)
	if err != nil {
		return "", 0, fmt.Errorf("srvr on %s: zxid %q: %w", addr, zxid, err)
	}
	return mode, z >> 32, nil
}

// zkQuiet drops the zk client's log lines.
type zkQuiet struct{}

func (zkQuiet) Printf(string, ...any) {}

// redisCounter reads a Redis fencing counter's value: its number, which
// tombstones of acquires cut short may follow for a minute ('!' and what
// follows: the redis package's cut.lua, redisscript.CounterOf).
func redisCounter(v string) (uint64, error) {
	num, _, _ := strings.Cut(v, "!")
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("fencing counter %q: %w", v, err)
	}
	return n, nil
}
