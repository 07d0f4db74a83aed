package servers

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// StartRedis starts n independent Redis servers (not a cluster, no
// replication, no persistence) and waits until they accept connections. The
// caller owns them and should Terminate them; [Main] removes any left over.
func StartRedis(ctx context.Context, n int) ([]*Server, error) {
	return startServers(ctx, "redis", n)
}

// StartRedisWithArgs is [StartRedis] with extra redis-server arguments
// appended to the default command line, where a later argument overrides
// an earlier one. For a server that persists its data across
// [Server.Kill] and [Server.Start], pass for example "--dir", "/tmp" and
// "--appendonly", "yes" (or "--save", "60 1"; SAVE then writes a snapshot
// that a restart loads).
func StartRedisWithArgs(ctx context.Context, n int, args ...string) ([]*Server, error) {
	return startServers(ctx, "redis", n, args...)
}

// StartRedisTLS starts n independent Redis servers as [StartRedis] does,
// serving clients over TLS only: [Server.Addr] is the TLS port, there is
// no plain-text one, and clients need no certificate. The servers'
// certificate, for 127.0.0.1 and localhost, is issued by a CA made for
// this call, whose certificate (PEM) is returned for the clients to trust.
// The caller owns the servers and should Terminate them.
func StartRedisTLS(ctx context.Context, n int) ([]*Server, []byte, error) {
	resp, err := call(ctx, request{Op: "new", Kind: "redis-tls", N: n})
	if err != nil {
		return nil, nil, err
	}
	out := make([]*Server, len(resp.Servers))
	for i, si := range resp.Servers {
		out[i] = newServer(si)
	}
	return out, resp.CAPEM, nil
}

// StartRedisCluster starts one Redis server in cluster mode that serves all
// 16384 hash slots alone (a one-master cluster) and waits until the cluster
// state is ok. As on any cluster, a script or multi-key command fails with
// CROSSSLOT unless its keys share a hash slot. The server does not learn
// its own address (it never meets another node), so a
// go-redis ClusterClient should map the slots to [Server.Addr] with
// ClusterOptions.ClusterSlots. The caller owns the server and should
// Terminate it.
func StartRedisCluster(ctx context.Context) (*Server, error) {
	ss, err := startServers(ctx, "redis-cluster", 1)
	if err != nil {
		return nil, err
	}
	return ss[0], nil
}

// RedisSentinel is a Redis primary with one replica, watched by one Sentinel
// (quorum 1, primary deemed down after 1s), for failover tests. Clients
// find the primary through the Sentinel, under MasterName.
type RedisSentinel struct {
	Primary, Replica, Sentinel *Server
	MasterName                 string
}

// Terminate removes the three containers.
func (r *RedisSentinel) Terminate(ctx context.Context) error {
	return errors.Join(r.Sentinel.Terminate(ctx), r.Replica.Terminate(ctx), r.Primary.Terminate(ctx))
}

// StartRedisSentinel starts a primary, a replica that has synced with it,
// and a Sentinel that knows both, so that killing the primary promotes the
// replica. It needs host networking (DLOCK_TEST_NETWORK=host; else it
// returns an error matching [ErrNeedsHostNetwork]): the servers announce
// their addresses to each other, and in bridge mode those would be the
// containers' private addresses. The caller owns the servers and should
// Terminate them.
func StartRedisSentinel(ctx context.Context) (*RedisSentinel, error) {
	ss, err := startServers(ctx, "redis-sentinel", 1)
	if err != nil {
		return nil, err
	}
	return &RedisSentinel{Primary: ss[0], Replica: ss[1], Sentinel: ss[2], MasterName: "dlock"}, nil
}

// Redis returns the test package's shared Redis servers, the first n of
// them. They are started on first use and reused by every later call (more
// are started if a later call asks for more). Tests must not stop, kill or
// pause shared servers; use [StartRedis] for that.
//
// If the servers cannot be started, Redis skips the test with the reason
// (for example "no Docker engine reachable: ..."), or fails it when
// DLOCK_REQUIRE_SERVERS=1.
func Redis(tb testing.TB, n int) []*Server {
	tb.Helper()
	return shared(tb, "redis", n)
}

// RedisTLS starts n Redis servers for tb with [StartRedisTLS], terminated
// when tb ends, and returns them and the CA certificate (PEM) to trust. If
// the servers cannot be started, it skips the test with the reason, or
// fails it when DLOCK_REQUIRE_SERVERS=1.
func RedisTLS(tb testing.TB, n int) ([]*Server, []byte) {
	tb.Helper()
	ss, ca, err := StartRedisTLS(tb.Context(), n)
	if err != nil {
		giveUp(tb, fmt.Sprintf("%d Redis TLS servers", n), err)
		return nil, nil
	}
	tb.Cleanup(func() {
		for _, s := range ss {
			_ = s.Terminate(context.WithoutCancel(tb.Context()))
		}
	})
	return ss, ca
}
