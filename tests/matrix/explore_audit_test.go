package matrix_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/zookeeper"
)

// auditor asks a backend's servers about a lease, directly (not through
// any client's proxies). Each method returns "" when all is well, a
// problem, or an error when the servers could not say.
type auditor struct {
	// held checks a lease held with Deadline dl: its lock is there and
	// dl is not past the server's expiry for it.
	held func(ctx context.Context, le *check.Lease, dl time.Time) (string, error)
	// released checks that a released lease's lock is gone.
	released func(ctx context.Context, le *check.Lease) (string, error)
}

// auditSlack absorbs rounding: a Deadline past the server's expiry by
// less is not reported.
const auditSlack = 5 * time.Millisecond

func newAuditor(t *testing.T, b *backend, d *deployment) *auditor {
	switch b.name {
	case bEtcd:
		return etcdAuditor(d.etcd)
	case bRedis, bRedlock:
		var cs []*goredis.Client
		for _, a := range d.addrs() {
			c := goredis.NewClient(&goredis.Options{Addr: a, MaxRetries: -1})
			t.Cleanup(func() { _ = c.Close() })
			cs = append(cs, c)
		}
		if b.name == bRedis {
			return redisAuditor(cs[0])
		}
		return redlockAuditor(cs)
	case bZooKeeper:
		conn, _, err := zk.Connect(d.addrs(), 10*time.Second, zk.WithLogger(zkQuiet{}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		if _, err := conn.Create(zkBarrier, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
		return zkAuditor(conn, d.addrs())
	}
	t.Fatalf("no auditor for %s", b.name)
	return nil
}

// etcdAuditor: the lock key (etcd.OwnerOf) must exist with the lease's
// token as its create revision, and the lease it is on (which may differ
// from the one the client keeps alive) must last until the Deadline:
// TimeToLive's remaining TTL is whole seconds, rounded down, counted
// before its answer came back, so the lease ends before that answer plus
// TTL+1 s. A shared lease (issue 24) has an entry of its own in the key's
// queue (its key under the lock's directory, its create revision the
// token), audited the same way.
func etcdAuditor(admin *clientv3.Client) *auditor {
	get := func(ctx context.Context, le *check.Lease) (*clientv3.GetResponse, etcd.Ownership, error) {
		own, ok := etcd.OwnerOf(le.Lease)
		if !ok {
			return nil, own, errors.New("not an etcd lease")
		}
		g, err := admin.Get(ctx, own.Key)
		return g, own, err
	}
	return &auditor{
		held: func(ctx context.Context, le *check.Lease, dl time.Time) (string, error) {
			g, own, err := get(ctx, le)
			if err != nil {
				return "", err
			}
			if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != own.CreateRevision {
				return fmt.Sprintf("its lock key %s (create revision %d) is gone", own.Key, own.CreateRevision), nil
			}
			id := clientv3.LeaseID(g.Kvs[0].Lease)
			r, err := admin.TimeToLive(ctx, id)
			done := time.Now()
			if err != nil {
				return "", err
			}
			if r.TTL < 0 {
				return fmt.Sprintf("the lease its key is on (%x) is gone", int64(id)), nil
			}
			if end := done.Add(time.Duration(r.TTL+1) * time.Second); dl.After(end.Add(auditSlack)) {
				kept := ""
				if id != own.Lease {
					kept = fmt.Sprintf(", not on lease %x, which the client keeps alive", int64(own.Lease))
				}
				return fmt.Sprintf("its key is on lease %x%s, which ends within %ds (granted %ds): the Deadline is %v past the server's expiry",
					int64(id), kept, r.TTL+1, r.GrantedTTL, dl.Sub(end).Round(time.Millisecond)), nil
			}
			return "", nil
		},
		released: func(ctx context.Context, le *check.Lease) (string, error) {
			g, own, err := get(ctx, le)
			if err != nil {
				return "", err
			}
			if len(g.Kvs) > 0 && g.Kvs[0].CreateRevision == own.CreateRevision {
				return fmt.Sprintf("its lock key %s is still there (on lease %x)", own.Key, g.Kvs[0].Lease), nil
			}
			return "", nil
		},
	}
}

// redisProbe returns the PTTL of the lock key (KEYS[1]) and the fencing
// counter (KEYS[2]), the token of the last grant.
var redisProbe = goredis.NewScript(`return {redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0'}`)

// redisLock returns the PTTL of key's lock on c and its fencing counter.
func redisLock(ctx context.Context, c *goredis.Client, prefix, key string) (pttl int64, counter uint64, err error) {
	lock := prefix + "{" + key + "}"
	v, err := redisProbe.Run(ctx, c, []string{lock, lock + redisscript.FenceSuffix}).Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(v) != 2 {
		return 0, 0, fmt.Errorf("probe: %v", v)
	}
	pttl, _ = v[0].(int64)
	s, _ := v[1].(string)
	counter, err = redisCounter(s)
	return pttl, counter, err
}

// redisAuditor: an exclusive lease's lock key must be there with the
// lease's token as the fencing counter (no grant since), and its PTTL must
// cover the Deadline; a shared lease (issue 24) must be among the key's
// shared holders (found by its token in their tokens hash), its score (its
// expiry on the server clock) covering the Deadline. The key's state is
// read in one script (redisState), whichever way it is held.
func redisAuditor(c *goredis.Client) *auditor {
	return &auditor{
		held: func(ctx context.Context, le *check.Lease, dl time.Time) (string, error) {
			st, err := redisState(ctx, c, le.Key(), le.Token())
			done := time.Now()
			switch {
			case err != nil:
				return "", err
			case st.kind == 3:
				return "its lock is gone (the key is reserved for a waiting writer, no holder)", nil
			case st.kind == 1:
				return fmt.Sprintf("its lock is gone (the key is held by shared leases, none with token %d)", le.Token()), nil
			case st.kind == 2 && st.left <= 0:
				return fmt.Sprintf("its lock is gone (its shared holder's score passed %v ago)", -st.left), nil
			case st.kind == 2 && dl.After(done.Add(st.left+auditSlack)):
				return fmt.Sprintf("its shared holder's score is %v ahead: the Deadline is %v past the server's expiry",
					st.left, dl.Sub(done.Add(st.left)).Round(time.Millisecond)), nil
			case st.kind == 2:
				return "", nil
			case st.pttl < 0 || st.counter != uint64(le.Token()):
				return fmt.Sprintf("its lock key is gone (PTTL %d, fencing counter %d)", st.pttl, st.counter), nil
			case dl.After(done.Add(time.Duration(st.pttl)*time.Millisecond + auditSlack)):
				return fmt.Sprintf("the lock key's PTTL is %dms: the Deadline is %v past the server's expiry",
					st.pttl, dl.Sub(done.Add(time.Duration(st.pttl)*time.Millisecond)).Round(time.Millisecond)), nil
			}
			return "", nil
		},
		released: func(ctx context.Context, le *check.Lease) (string, error) {
			st, err := redisState(ctx, c, le.Key(), le.Token())
			switch {
			case err != nil:
				return "", err
			case st.kind == 2 && st.left > 0:
				return fmt.Sprintf("it is still among the key's shared holders (%v left)", st.left), nil
			case st.kind == 0 && st.pttl >= 0 && st.counter == uint64(le.Token()):
				return fmt.Sprintf("its lock key is still there (PTTL %dms, no grant since)", st.pttl), nil
			}
			return "", nil
		},
	}
}

// redlockAuditor: a majority of the nodes must have the lock key with a
// PTTL that covers the Deadline. Whose lock it is cannot be told (the
// nodes' counters are not a consensus-grade token), and a released lock is
// not checked for the same reason.
func redlockAuditor(cs []*goredis.Client) *auditor {
	quorum := len(cs)/2 + 1
	return &auditor{
		held: func(ctx context.Context, le *check.Lease, dl time.Time) (string, error) {
			covered, answered := 0, 0
			for _, c := range cs {
				nctx, cancel := context.WithTimeout(ctx, time.Second)
				pttl, _, err := redisLock(nctx, c, redlock.DefaultPrefix, le.Key())
				cancel()
				done := time.Now()
				if err != nil {
					continue
				}
				answered++
				if pttl >= 0 && !dl.After(done.Add(time.Duration(pttl)*time.Millisecond+auditSlack)) {
					covered++
				}
			}
			if covered < quorum && covered+len(cs)-answered < quorum {
				return fmt.Sprintf("only %d of %d nodes have the lock key until the Deadline (%d answered)", covered, len(cs), answered), nil
			}
			return "", nil
		},
		released: func(context.Context, *check.Lease) (string, error) { return "", nil },
	}
}

// zkAuditor: the lock node (the child of the key's node whose czxid is the
// lease's token) must be there, and the Deadline must not be past its
// session's expiry as the leader has it (the leader expires sessions): the
// four-letter word dump on the leader lists its sessions by the moment
// they expire, rounded up to a tick, printed to the second (Java's
// Date.toString, truncated), so a session expires before that second's
// end, and only a Deadline more than that second's rest past the expiry is
// seen. A shared lease (issue 24) has a node of its own in the key's
// queue, found the same way.
func zkAuditor(conn *zk.Conn, addrs []string) *auditor {
	// errBehind: the auditor's server had not yet applied the lease's
	// create when it answered (see find).
	errBehind := errors.New("the auditor's server has not applied the lock node's create yet")
	find := func(le *check.Lease) (string, *zk.Stat, error) {
		parent := zookeeper.DefaultPrefix + "/" + le.Key()
		// The admin's server may lag behind the client's: catch up
		// with the leader first (reads are not linearizable). That is
		// not enough on the leader itself: ZooKeeper (3.8) answers a
		// sync of the leader's own client at once, and the leader
		// applies a commit only after sending it to the followers, so
		// a read on the leader may miss a create that the client's
		// server has applied and answered. A miss therefore counts
		// only from a server that has applied the create: the key's
		// node (or, if that is gone, the prefix's) has a Pzxid (the
		// zxid of the last change to its children) at least the
		// token (the create's zxid); else the audit is unanswered.
		if _, err := conn.Sync(parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return "", nil, err
		}
		kids, pst, err := conn.Children(parent)
		if errors.Is(err, zk.ErrNoNode) {
			ok, st, err := conn.Exists(zookeeper.DefaultPrefix)
			switch {
			case err != nil:
				return "", nil, err
			case !ok || st.Pzxid < int64(le.Token()):
				return "", nil, errBehind
			}
			return "", nil, nil
		}
		if err != nil {
			return "", nil, err
		}
		for _, k := range kids {
			ok, st, err := conn.Exists(parent + "/" + k)
			if err != nil {
				return "", nil, err
			}
			if ok && st.Czxid == int64(le.Token()) {
				return parent + "/" + k, st, nil
			}
		}
		if pst.Pzxid < int64(le.Token()) {
			return "", nil, errBehind
		}
		return "", nil, nil
	}
	return &auditor{
		held: func(_ context.Context, le *check.Lease, dl time.Time) (string, error) {
			_, st, err := find(le)
			if err != nil {
				return "", err
			}
			if st == nil {
				// For the report: what the leader holds under the
				// key (its dump lists every session's ephemeral
				// nodes).
				return fmt.Sprintf("its lock node (czxid %d) is gone (the auditor's server %s; %s)",
					le.Token(), conn.Server(), zkLeaderEphemerals(addrs, zookeeper.DefaultPrefix+"/"+le.Key()+"/")), nil
			}
			exp, err := zkSessionExpiry(addrs, st.EphemeralOwner)
			if err != nil {
				return "", err
			}
			if dl.After(exp.Add(auditSlack)) {
				return fmt.Sprintf("its session 0x%x expires by %v on the leader, %v before the Deadline",
					st.EphemeralOwner, exp.Format(time.TimeOnly), dl.Sub(exp).Round(time.Millisecond)), nil
			}
			return "", nil
		},
		released: func(_ context.Context, le *check.Lease) (string, error) {
			path, st, err := find(le)
			if err != nil || st == nil {
				return "", err
			}
			// Still there: perhaps on a server that has not applied
			// the release's delete yet (see find). A write of the
			// auditor's own is answered once its server has applied
			// every earlier transaction: look again after one.
			if _, err := conn.Set(zkBarrier, nil, -1); err != nil {
				return "", err
			}
			if path, st, err = find(le); err != nil || st == nil {
				return "", err
			}
			return fmt.Sprintf("its lock node %s is still there", path), nil
		},
	}
}

// zkLeaderEphemerals describes, for a report, the ephemeral nodes whose
// path begins with prefix that the ZooKeeper leader among addrs lists
// (its dump, by session).
func zkLeaderEphemerals(addrs []string, prefix string) string {
	for _, a := range addrs {
		out, err := zkFourLetter(a, "dump")
		if err != nil || !strings.Contains(out, "Session Sets (") {
			continue
		}
		var found []string
		session := ""
		for line := range strings.Lines(out) {
			t := strings.TrimSpace(line)
			switch {
			case strings.HasPrefix(t, "0x") && strings.HasSuffix(t, ":"):
				session = strings.TrimSuffix(t, ":")
			case strings.HasPrefix(t, prefix):
				found = append(found, t+" (session "+session+")")
			}
		}
		return fmt.Sprintf("the leader %s lists %d ephemeral nodes under the key: %s", a, len(found), strings.Join(found, ", "))
	}
	return "no leader answered dump"
}

// zkBarrier is a node the ZooKeeper auditor writes to wait until its
// server has applied every earlier transaction.
const zkBarrier = "/dlock-explore-audit-barrier"

// zkSessionExpiry returns when the ZooKeeper leader among addrs expires
// session id at the latest: the end of the second its dump prints for it
// (the bucket the session is in: "N expire at Fri Nov 27 02:03:47 UTC
// 2026:" followed by the sessions, one per line, "\t0x…"). An error if no
// server answers as the leader, or the leader does not list the session.
func zkSessionExpiry(addrs []string, id int64) (time.Time, error) {
	want := fmt.Sprintf("0x%x", id)
	var errs []error
	for _, a := range addrs {
		out, err := zkFourLetter(a, "dump")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !strings.Contains(out, "Session Sets (") {
			continue // a follower: its dump lists no expiries
		}
		var at time.Time
		for line := range strings.Lines(out) {
			line = strings.TrimSpace(line)
			if _, d, ok := strings.Cut(line, " expire at "); ok && !strings.HasPrefix(line, "ip:") {
				t, err := time.Parse("Mon Jan 02 15:04:05 MST 2006", strings.TrimSuffix(d, ":"))
				if err != nil || (t.Location().String() != "UTC" && t.Location().String() != "GMT") {
					return time.Time{}, fmt.Errorf("dump on %s: the expiry %q is not a UTC date: %v", a, d, err)
				}
				at = t
				continue
			}
			if line == want {
				if at.IsZero() {
					return time.Time{}, fmt.Errorf("dump on %s: session %s listed before any expiry", a, want)
				}
				return at.Add(time.Second), nil
			}
			if strings.HasPrefix(line, "ephemeral nodes dump") {
				break
			}
		}
		return time.Time{}, fmt.Errorf("dump on the leader %s: session %s not listed (expired?)", a, want)
	}
	return time.Time{}, fmt.Errorf("no ZooKeeper server answered dump as the leader: %w", errors.Join(errs...))
}
