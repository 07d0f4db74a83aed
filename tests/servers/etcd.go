package servers

import (
	"context"
	"fmt"
	"testing"
)

// EtcdCluster is an etcd cluster (version 3.7 by default) whose members run
// in containers of their own, without authentication, and without TLS
// unless started by [StartEtcdTLS].
//
// Each member is a [Server], so the fault controls work on members; a member
// brought back by [Server.Start] after Stop or Kill rejoins with its data.
// Start waits until the member serves clients, which needs a quorum of
// members running: to bring back a majority that was stopped, start the
// members concurrently.
//
// Timing is etcd's default (100ms heartbeat, 1s election timeout):
// elections after a leader dies take about a second, and the server's
// minimum lease TTL is 2s (shorter TTLs are raised to it).
type EtcdCluster struct {
	// Members are the cluster's members (named etcd0, etcd1, ... in etcd).
	// Server.Addr of a member is its client endpoint.
	Members []*Server

	// CAPEM is the PEM certificate of the CA that issued the members'
	// server certificate, for a cluster from [StartEtcdTLS]; nil otherwise.
	CAPEM []byte

	g *group
}

// Endpoints returns the members' client endpoints (127.0.0.1:port, in the
// order of Members), for go.etcd.io/etcd/client/v3's Config.Endpoints. In
// bridge mode a restarted member may be published on another port; call
// Endpoints again after Start.
func (c *EtcdCluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, s := range c.Members {
		eps[i] = s.Addr()
	}
	return eps
}

// String returns a short description for test logs.
func (c *EtcdCluster) String() string {
	return fmt.Sprintf("etcd%v", c.Endpoints())
}

// Terminate stops every member, removes their containers, and removes the
// cluster's network if it has one. Terminating twice is harmless.
func (c *EtcdCluster) Terminate(ctx context.Context) error {
	return c.g.terminate(ctx)
}

func newEtcdCluster(g *group) *EtcdCluster {
	return &EtcdCluster{Members: g.servers, CAPEM: g.caPEM, g: g}
}

// StartEtcd starts an etcd cluster of n members (n = 1: a single node) and
// waits until every member serves clients. The caller owns the cluster and
// should Terminate it; [Main] removes any left over.
func StartEtcd(ctx context.Context, n int) (*EtcdCluster, error) {
	g, err := startCluster(ctx, "etcd", n)
	if err != nil {
		return nil, err
	}
	return newEtcdCluster(g), nil
}

// StartEtcdTLS starts an etcd cluster as [StartEtcd] does, serving clients
// over TLS (members talk to each other in plain HTTP). The server
// certificate, for 127.0.0.1 and localhost, is issued by a CA made for this
// cluster; its certificate is the cluster's CAPEM, for the clients to trust.
func StartEtcdTLS(ctx context.Context, n int) (*EtcdCluster, error) {
	g, err := startCluster(ctx, "etcd-tls", n)
	if err != nil {
		return nil, err
	}
	return newEtcdCluster(g), nil
}

// Etcd returns the test package's shared etcd cluster of exactly n members.
// It is started on first use and reused by every later call with the same n;
// clusters of different sizes are separate (Etcd(tb, 1) and Etcd(tb, 3) are
// two clusters). Tests must not stop, kill or pause members of a shared
// cluster; use [StartEtcd] for that.
//
// If the cluster cannot be started, Etcd skips the test with the reason, or
// fails it when DLOCK_REQUIRE_SERVERS=1.
func Etcd(tb testing.TB, n int) *EtcdCluster {
	tb.Helper()
	return sharedCluster(tb, "etcd", n, newEtcdCluster)
}
