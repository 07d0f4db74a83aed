package servers

import (
	"context"
	"fmt"
	"testing"
)

// ZooKeeperEnsemble is a ZooKeeper ensemble (version 3.8 by default) whose
// servers run in containers of their own, without authentication and
// without TLS unless started by [StartZooKeeperTLS]: a single standalone
// server, or several servers that replicate each other.
//
// Servers tick every 200ms, and accept session timeouts from 400ms to 2
// minutes; container nodes are supported, and all four-letter words
// (ruok, srvr, ...) are allowed.
//
// Each server is a [Server], so the fault controls work on them; a server
// brought back by [Server.Start] after Stop or Kill comes back with its data.
// Start waits until the server serves clients, which for an ensemble member
// needs a quorum of servers running: to bring back a majority that was
// stopped, start the servers concurrently.
type ZooKeeperEnsemble struct {
	// Members are the ensemble's servers (myid 1, 2, ... in order; a
	// standalone server has none). Server.Addr of a member is its client
	// address.
	Members []*Server

	// CAPEM is the PEM certificate of the CA that issued the servers'
	// certificate, for an ensemble from [StartZooKeeperTLS]; nil otherwise.
	CAPEM []byte

	g *group
}

// Servers returns the servers' client addresses (127.0.0.1:port, in the
// order of Members), for github.com/go-zookeeper/zk's Connect. In bridge
// mode a restarted server may be published on another port; call Servers
// again after Start.
func (e *ZooKeeperEnsemble) Servers() []string {
	addrs := make([]string, len(e.Members))
	for i, s := range e.Members {
		addrs[i] = s.Addr()
	}
	return addrs
}

// String returns a short description for test logs.
func (e *ZooKeeperEnsemble) String() string {
	return fmt.Sprintf("zookeeper%v", e.Servers())
}

// Terminate stops every server, removes their containers, and removes the
// ensemble's network if it has one. Terminating twice is harmless.
func (e *ZooKeeperEnsemble) Terminate(ctx context.Context) error {
	return e.g.terminate(ctx)
}

func newZooKeeperEnsemble(g *group) *ZooKeeperEnsemble {
	return &ZooKeeperEnsemble{Members: g.servers, CAPEM: g.caPEM, g: g}
}

// StartZooKeeper starts a ZooKeeper ensemble of n servers (n = 1: a
// standalone server; use an odd n, such as 3, for an ensemble) and waits
// until every server serves clients. The caller owns the ensemble and should
// Terminate it; [Main] removes any left over.
func StartZooKeeper(ctx context.Context, n int) (*ZooKeeperEnsemble, error) {
	g, err := startCluster(ctx, "zookeeper", n)
	if err != nil {
		return nil, err
	}
	return newZooKeeperEnsemble(g), nil
}

// StartZooKeeperTLS starts a ZooKeeper ensemble as [StartZooKeeper] does,
// serving clients over TLS only (the client address is a
// secureClientPort; servers talk to each other in plain TCP). The server
// certificate, for 127.0.0.1 and localhost, is issued by a CA made for
// this ensemble; its certificate is the ensemble's CAPEM, for the clients
// to trust. No client certificate is asked for.
func StartZooKeeperTLS(ctx context.Context, n int) (*ZooKeeperEnsemble, error) {
	g, err := startCluster(ctx, "zookeeper-tls", n)
	if err != nil {
		return nil, err
	}
	return newZooKeeperEnsemble(g), nil
}

// ZooKeeper returns the test package's shared ZooKeeper ensemble of exactly
// n servers. It is started on first use and reused by every later call with
// the same n; ensembles of different sizes are separate (ZooKeeper(tb, 1)
// and ZooKeeper(tb, 3) are two ensembles). Tests must not stop, kill or
// pause servers of a shared ensemble; use [StartZooKeeper] for that.
//
// If the ensemble cannot be started, ZooKeeper skips the test with the
// reason, or fails it when DLOCK_REQUIRE_SERVERS=1.
func ZooKeeper(tb testing.TB, n int) *ZooKeeperEnsemble {
	tb.Helper()
	return sharedCluster(tb, "zookeeper", n, newZooKeeperEnsemble)
}

// ZooKeeperTLS is [ZooKeeper] for an ensemble from [StartZooKeeperTLS]:
// the test package's shared one of exactly n servers serving TLS only.
func ZooKeeperTLS(tb testing.TB, n int) *ZooKeeperEnsemble {
	tb.Helper()
	return sharedCluster(tb, "zookeeper-tls", n, newZooKeeperEnsemble)
}
