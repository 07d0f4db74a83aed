package matrix_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/tests/servers"
)

// A Redis primary with one replica and a Sentinel (issue 11, fault 5). The
// victim takes the lock with WaitReplicas 1, so the grant reaches the
// replica before the victim has it. WAIT covers only the acquire: the
// victim's Refresh, which its Deadline then rests on, is not waited for.
// The replica misses that refresh (its link to the primary is cut, as by
// a network fault, when the refresh is made); the primary is killed; the
// Sentinel promotes the replica, where the lock still has the grant's
// expiry. A contender is granted when that passes, while the victim's
// refreshed lease is valid for another 20s. The victim's release then
// finds its lock gone (ErrNotHeld); the contenders' releases on the new
// primary must all succeed.
func init() {
	register(&scenario{
		order:   50,
		name:    "FailoverBeforeReplication",
		row:     "Redis primary killed, replica promoted by Sentinel (wait_replicas=1)",
		applies: only(bRedis),
		expect: expectIf(noFailover, violation, "replication is asynchronous and WAIT covers only the acquire: the promoted replica "+
			"missed the holder's refresh, so the lock expired there early and a second holder was granted while the first one's lease was valid"),
		run: runFailover,
	})
}

const (
	// failoverTTL is the victim's grant: long enough to outlast the
	// failover (a few seconds), so that the promoted replica is seen to
	// have the grant.
	failoverTTL = 10 * time.Second
	// failoverRefresh is what the victim's refresh extends its lease to.
	failoverRefresh = 30 * time.Second
	// failoverReleases is how many contender releases on the new
	// primary, after the victim's, the cell waits for (each must
	// succeed).
	failoverReleases = 5
)

func runFailover(t *testing.T, e *env) {
	ctx := t.Context()
	r, err := servers.StartRedisSentinel(ctx)
	if err != nil {
		t.Fatal(err) // the matrix has host networking
	}
	t.Cleanup(func() { _ = r.Terminate(context.WithoutCancel(t.Context())) })
	// Lockers through go-redis failover clients, as the servers' users
	// would have.
	newLocker := func(waitReplicas int) *dlock.Locker {
		c := goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:            r.MasterName,
			SentinelAddrs:         []string{r.Sentinel.Addr()},
			ContextTimeoutEnabled: true,
		})
		t.Cleanup(func() { _ = c.Close() })
		l, err := redis.New(ctx, c, &redis.Options{WaitReplicas: waitReplicas})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return e.useLocker(l)
	}
	primary := crashRedisClient(t, r.Primary.Addr())
	replica := crashRedisClient(t, r.Replica.Addr())
	lockKey := redis.DefaultPrefix + "{" + e.key + "}"

	actx, cancel := context.WithTimeout(ctx, crashBound)
	victim, err := e.h.TryAcquire(actx, "victim", newLocker(1), e.key, &dlock.AcquireOptions{TTL: failoverTTL})
	cancel()
	granted := time.Now()
	if err != nil {
		t.Fatalf("the victim's acquire with WaitReplicas 1: %v", err)
	}
	read, ok := e.reg.Read(victim.Token())
	if !ok {
		t.Fatalf("the register refused the victim's token %d", victim.Token())
	}
	owner := crashRedisGet(t, r.Replica.Addr(), lockKey)
	if owner == "" {
		t.Fatal("the replica does not have the lock the acquire waited for")
	}

	// The contenders do not wait for replicas: after the failover there
	// are none (the old primary stays down), and every grant would fail.
	crowd := crashStartCrowd(t, e, crashContenders, func() *dlock.Locker { return newLocker(0) })
	isContender := func(op check.Op) bool { return crowd.names[op.Client] }
	crowd.awaitAllWaiting(t)

	// Cut the replica off: the primary refuses its (re)synchronisation
	// and drops its link. The replica, unable to catch up, gets nothing
	// the primary writes from now on.
	if err := primary.Do(ctx, "ACL", "SETUSER", "default", "-psync", "-sync").Err(); err != nil {
		t.Fatalf("ACL SETUSER on the primary: %v", err)
	}
	if err := primary.ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE replica: %v", err)
	}
	crashAwaitRedis(t, r.Primary.Addr(), "connected_slaves:0", "the primary to have no replica")
	crashAwaitRedis(t, r.Replica.Addr(), "master_link_status:down", "the replica's link to be down")

	if err := victim.Refresh(ctx, failoverRefresh); err != nil {
		t.Fatalf("the victim's refresh: %v", err)
	}
	onPrimary := primary.PTTL(ctx, lockKey).Val()
	onReplica := replica.PTTL(ctx, lockKey).Val()
	if onPrimary <= failoverTTL || onReplica <= 0 || onReplica > failoverTTL {
		t.Fatalf("after the refresh the lock expires in %v on the primary, %v on the replica: want beyond %v on the primary only",
			onPrimary, onReplica, failoverTTL)
	}
	t.Logf("refreshed to %v on the primary; the replica still has %v", onPrimary, onReplica)

	t.Logf("kill -9 the primary %v", r.Primary)
	killed := time.Now()
	if err := r.Primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	// The Sentinel promotes the replica; the clients find it.
	sentinel := goredis.NewSentinelClient(&goredis.Options{Addr: r.Sentinel.Addr()})
	t.Cleanup(func() { _ = sentinel.Close() })
	_, replicaPort, err := net.SplitHostPort(r.Replica.Addr())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		addr, err := sentinel.GetMasterAddrByName(ctx, r.MasterName).Result()
		if err == nil && len(addr) == 2 && addr[1] == replicaPort {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the Sentinel did not promote the replica within 30s: %v %v", addr, err)
		}
	}
	crashAwaitRedis(t, r.Replica.Addr(), "role:master", "the replica to be promoted")
	promoted := time.Now()
	for _, l := range crowd.lockers {
		crashAwaitReachable(t, l)
	}
	recovered := time.Now()
	// Until the clients reach the new primary (and 2s more for attempts
	// under way then) the lock cannot serve.
	e.h.Fault("kill -9 of the Redis primary, Sentinel failover", killed, recovered.Add(2*time.Second))
	t.Logf("replica promoted %v after the kill; the contenders reached it %v after the kill",
		promoted.Sub(killed).Round(time.Millisecond), recovered.Sub(killed).Round(time.Millisecond))

	// The new primary has the victim's lock (WAIT made sure of the
	// grant), with the grant's expiry: before the victim's Deadline.
	v := crashRedisGet(t, r.Replica.Addr(), lockKey)
	left := replica.PTTL(ctx, lockKey).Val()
	switch {
	case v == owner && time.Now().Add(left).Before(victim.Deadline()):
		t.Logf("the new primary has the victim's lock for %v more; the victim's lease is valid for %v",
			left.Round(time.Millisecond), time.Until(victim.Deadline()).Round(time.Millisecond))
	case v == owner:
		t.Fatalf("the new primary has the victim's lock for %v: it did not miss the refresh", left)
	default:
		t.Fatalf("the new primary does not have the victim's lock (%q) %v after the grant; the acquire waited for the replica",
			v, time.Since(granted).Round(time.Millisecond))
	}

	// A contender is granted when the grant's expiry passes.
	e.awaitOps(t, failoverTTL+crashBound, "contender's grant after the failover", func(ops []check.Op) bool {
		return crashHas(ops, func(op check.Op) bool { return op.Granted() && isContender(op) && op.End.After(killed) })
	})
	if victim.Err() != nil || !time.Now().Before(victim.Deadline()) {
		t.Fatalf("the victim's lease ended (%v) before a contender's grant was seen: no overlap shown", victim.Err())
	}
	e.reg.Write(victim.Client(), victim.ID(), victim.Token(), victim.Deadline(), read)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	released := time.Now()
	err = victim.Release(rctx)
	cancel()
	if !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("the victim's Release after a contender's grant = %v, want ErrNotHeld", err)
	}
	// The new primary serves the lock: the contenders take turns there,
	// and every release of a lease granted there succeeds (e.cycle
	// tolerates ErrNotHeld, which would hide a primary that lost its
	// locks again).
	isNewRelease := func(op check.Op) bool {
		return op.Kind == check.Release && isContender(op) && op.Start.After(released)
	}
	e.awaitOps(t, crashBound, fmt.Sprintf("%d contender releases on the new primary after the victim's", failoverReleases), func(ops []check.Op) bool {
		return crashCount(ops, isNewRelease) >= failoverReleases
	})
	grantedAt := map[int]time.Time{}
	n := 0
	for _, op := range e.h.Ops() {
		switch {
		case op.Granted():
			grantedAt[op.ID] = op.End
		case op.Kind == check.Release && isContender(op) && grantedAt[op.Lease].After(killed):
			n++
			if op.Err != nil {
				t.Errorf("%s's Release of lease %d (granted on the new primary): %v, want nil", op.Client, op.Lease, op.Err)
			}
		}
	}
	t.Logf("%d contender releases of leases granted on the new primary, %d of them after the victim's", n, crashCount(e.h.Ops(), isNewRelease))
	crashOnlyOverlap(t, e)
}
