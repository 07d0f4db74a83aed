package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// zookeeperDir is the directory, inside the container, that holds a
// server's zoo.cfg and its data directory (dataDir, with the myid file of an
// ensemble member). It is not a volume, so it survives Stop and Kill (the
// container keeps its filesystem) and a restarted server comes back with its
// data.
const zookeeperDir = "/var/lib/dlock-zookeeper"

// zookeeperScript is the container's command, run by sh -c with the
// arguments $0 = zookeeperDir, $1 = the content of zoo.cfg and $2 = the
// server's myid ("" for a standalone server). It writes both files (again on
// every start: they do not change) and runs the server in the foreground
// with zkServer.sh, which both the official image (its bin directory) and
// the Debian stand-in (/usr/share/zookeeper/bin) have on the PATH.
const zookeeperScript = `set -e
mkdir -p "$0/data"
printf '%s' "$1" >"$0/zoo.cfg"
if [ -n "$2" ]; then printf '%s\n' "$2" >"$0/data/myid"; fi
exec zkServer.sh start-foreground "$0/zoo.cfg"`

// zookeeperConfig returns the zoo.cfg of member i of p.
func zookeeperConfig(p *plan, i int) string {
	m := p.members[i]
	lines := []string{
		// Fast ticks: the lock backend's tests use short sessions. Sessions
		// may last from 2 ticks up to 2 minutes (the conformance suite asks
		// for leases of up to a minute, and the backend needs a session at
		// least as long as the lease's TTL).
		"tickTime=200",
		"initLimit=10",
		"syncLimit=5",
		"minSessionTimeout=400",
		"maxSessionTimeout=120000",
		"dataDir=" + zookeeperDir + "/data",
		"clientPort=" + strconv.Itoa(m.ports[0]),
		"clientPortAddress=" + m.bind,
		"admin.enableServer=false",
		"4lw.commands.whitelist=*",
		// Container nodes (CreateContainer) need nothing: ZooKeeper 3.5.3
		// and later support them by default. TTL nodes
		// (extendedTypesEnabled) are not used.
	}
	if len(p.members) == 1 {
		lines = append(lines, "standaloneEnabled=true")
	} else {
		if m.bind != m.host {
			// Bridge mode: accept peers on every address, not only on
			// the one the member's own name resolves to.
			lines = append(lines, "quorumListenOnAllIPs=true")
		}
		for j, o := range p.members {
			lines = append(lines, fmt.Sprintf("server.%d=%s:%d:%d", j+1, o.host, o.ports[1], o.ports[2]))
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// zookeeperKind: a ZooKeeper server, standalone (a group of one) or a member
// of an ensemble. The server's data directory is inside the container (see
// zookeeperDir), so it survives Stop and Kill.
//
// In host mode every server listens on 127.0.0.1 with client, quorum and
// election ports chosen up front (server.N=127.0.0.1:quorum:election). In
// bridge mode the members share a network of their own and name each other
// by their aliases (server.N=zookeeperK:2888:3888); only the client port
// 2181 is published.
var zookeeperKind = &kind{
	name:         "zookeeper",
	imageEnv:     "DLOCK_ZOOKEEPER_IMAGE",
	defaultImage: "zookeeper:3.8",
	ports:        []int{2181, 2888, 3888}, // client, quorum, leader election
	cluster:      true,
	cmd: func(p *plan, i int) []string {
		myid := ""
		if len(p.members) > 1 {
			myid = strconv.Itoa(i + 1)
		}
		return []string{"sh", "-c", zookeeperScript, zookeeperDir, zookeeperConfig(p, i), myid}
	},
	readyLog: func(p *plan, _ int) string {
		if len(p.members) == 1 {
			// A standalone server logs this when it creates its
			// container-node manager, right after the server has started
			// serving clients; once per start.
			return `Using checkIntervalMs=`
		}
		// An ensemble member logs this when, having joined the quorum as
		// leader or follower, it has synchronised and serves clients: at
		// least once per start, and again after every new election.
		return `Peer state changed: (leading|following) - broadcast`
	},
}

// ZooKeeperEnsemble is a ZooKeeper ensemble (version 3.8 by default) whose
// servers run in containers of their own, without authentication: a single
// standalone server, or several servers that replicate each other.
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
	return &ZooKeeperEnsemble{Members: g.servers, g: g}
}

// StartZooKeeper starts a ZooKeeper ensemble of n servers (n = 1: a
// standalone server; use an odd n, such as 3, for an ensemble) and waits
// until every server serves clients. The caller owns the ensemble and should
// Terminate it; [Main] removes any left over.
func StartZooKeeper(ctx context.Context, n int) (*ZooKeeperEnsemble, error) {
	g, err := startCluster(ctx, zookeeperKind, n)
	if err != nil {
		return nil, err
	}
	return newZooKeeperEnsemble(g), nil
}
