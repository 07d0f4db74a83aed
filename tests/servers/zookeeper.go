package servers

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ZooKeeperTick is the test servers' tickTime: fast, since the lock
// backend's tests use short sessions. Sessions may last from 2 ticks up to
// 2 minutes (the conformance suite asks for leases of up to a minute, and
// the backend needs a session at least as long as the lease's TTL).
const ZooKeeperTick = 200 * time.Millisecond

// zookeeperSyncLimit is the ensembles' syncLimit, in ticks.
const zookeeperSyncLimit = 5

// ZooKeeperSyncTimeout is syncLimit ticks: an ensemble member that hears
// nothing from its leader (or a leader from a follower) for this long
// leaves the quorum, and drops its clients' connections when it comes
// back. A fault meant to leave every client connected (a pause of a
// member) must stay shorter.
const ZooKeeperSyncTimeout = zookeeperSyncLimit * ZooKeeperTick

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

// zookeeperConfig returns the zoo.cfg of member i of p; with tls, its
// client port is a secureClientPort (StartZooKeeperTLS).
func zookeeperConfig(p *plan, i int, tls bool) string {
	m := p.members[i]
	client := []string{
		"clientPort=" + strconv.Itoa(m.ports[0]),
		"clientPortAddress=" + m.bind,
	}
	lines := []string{
		"tickTime=" + strconv.FormatInt(ZooKeeperTick.Milliseconds(), 10),
		"initLimit=10",
		"syncLimit=" + strconv.Itoa(zookeeperSyncLimit),
		"minSessionTimeout=" + strconv.FormatInt(2*ZooKeeperTick.Milliseconds(), 10),
		"maxSessionTimeout=120000",
		"dataDir=" + zookeeperDir + "/data",
		"admin.enableServer=false",
		"4lw.commands.whitelist=*",
		// Container nodes (CreateContainer) need nothing: ZooKeeper 3.5.3
		// and later support them by default. TTL nodes
		// (extendedTypesEnabled) are not used.
	}
	if tls {
		// TLS only (StartZooKeeperTLS): Netty serves the secure port,
		// with PEM stores (ZooKeeper 3.8); no client certificate asked.
		client = []string{
			"secureClientPort=" + strconv.Itoa(m.ports[0]),
			"secureClientPortAddress=" + m.bind,
			"serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
			"ssl.keyStore.location=" + zookeeperKeyStore,
			"ssl.keyStore.type=PEM",
			"ssl.trustStore.location=" + zookeeperTrustStore,
			"ssl.trustStore.type=PEM",
			"ssl.clientAuth=none",
		}
	}
	lines = append(lines, client...)
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

// zookeeperCmd is the command of member i of p (see zookeeperConfig).
func zookeeperCmd(p *plan, i int, tls bool) []string {
	myid := ""
	if len(p.members) > 1 {
		myid = strconv.Itoa(i + 1)
	}
	script := zookeeperScript
	if tls {
		script = zookeeperNettyJars + script
	}
	return []string{"sh", "-c", script, zookeeperDir, zookeeperConfig(p, i, tls), myid}
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
	cmd:          func(p *plan, i int) []string { return zookeeperCmd(p, i, false) },
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

// The PEM key store (the server's PKCS#8 key, then its certificate) and
// trust store (the CA) of a ZooKeeper from StartZooKeeperTLS.
const (
	zookeeperKeyStore   = "/etc/dlock-zookeeper-keystore.pem"
	zookeeperTrustStore = "/etc/dlock-zookeeper-ca.pem"
)

// zookeeperNettyJars puts on the Debian stand-in's class path the Netty
// jars its NettyServerCnxnFactory needs and zookeeper.jar's manifest leaves
// out (netty-codec and what it needs): zkServer.sh puts SERVER_JVMFLAGS
// after its own -cp, so this -cp wins. The official image has every jar in
// its lib directory already.
const zookeeperNettyJars = `if [ -f /usr/share/java/zookeeper.jar ] && [ -f /usr/share/java/netty-codec.jar ]; then
  export SERVER_JVMFLAGS="-cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar:/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar:/usr/share/java/netty-transport-native-unix-common.jar $SERVER_JVMFLAGS"
fi
`

// StartZooKeeperTLS starts a ZooKeeper ensemble as [StartZooKeeper] does,
// serving clients over TLS only (its client port is a secureClientPort;
// servers talk to each other in plain TCP). The server certificate, for
// 127.0.0.1 and localhost, is issued by a CA made for this ensemble; its
// certificate is the ensemble's CAPEM, for the clients to trust.
func StartZooKeeperTLS(ctx context.Context, n int) (*ZooKeeperEnsemble, error) {
	ca, cert, key, err := newTLSCert()
	if err != nil {
		return nil, err
	}
	// ZooKeeper's PEM reader takes PKCS#8 keys only.
	b, _ := pem.Decode(key)
	if b == nil {
		return nil, fmt.Errorf("servers: the test key is not PEM")
	}
	k, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("servers: the test key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("servers: the test key: %w", err)
	}
	store := append(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), cert...)
	kind := *zookeeperKind
	kind.files = map[string][]byte{zookeeperKeyStore: store, zookeeperTrustStore: ca}
	kind.cmd = func(p *plan, i int) []string { return zookeeperCmd(p, i, true) }
	g, err := startCluster(ctx, &kind, n)
	if err != nil {
		return nil, err
	}
	e := newZooKeeperEnsemble(g)
	e.CAPEM = ca
	return e, nil
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
