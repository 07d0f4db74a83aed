package servers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// redisKind: a Redis server without persistence, so that a restart or a
// kill loses every key, as an unpersisted production server would.
var redisKind = &kind{
	name:         "redis",
	imageEnv:     "DLOCK_REDIS_IMAGE",
	defaultImage: "redis:7.2",
	ports:        []int{6379},
	cmd: func(p *plan, i int) []string {
		m := p.members[i]
		return []string{
			"redis-server",
			"--port", strconv.Itoa(m.ports[0]),
			"--bind", m.bind,
			"--protected-mode", "no",
			"--save", "",
			"--appendonly", "no",
		}
	},
	readyLog: literal("Ready to accept connections"),
}

// StartRedis starts n independent Redis servers (not a cluster, no
// replication, no persistence) and waits until they accept connections. The
// caller owns them and should Terminate them; [Main] removes any left over.
func StartRedis(ctx context.Context, n int) ([]*Server, error) {
	return start(ctx, redisKind, n)
}

// StartRedisWithArgs is [StartRedis] with extra redis-server arguments
// appended to the default command line, where a later argument overrides
// an earlier one. For a server that persists its data across
// [Server.Kill] and [Server.Start], pass for example "--dir", "/tmp" and
// "--appendonly", "yes" (or "--save", "60 1"; SAVE then writes a snapshot
// that a restart loads).
func StartRedisWithArgs(ctx context.Context, n int, args ...string) ([]*Server, error) {
	k := *redisKind
	k.cmd = func(p *plan, i int) []string {
		return append(redisKind.cmd(p, i), args...)
	}
	return start(ctx, &k, n)
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
	k := *redisKind
	// The cluster bus needs a port of its own: by default the client port
	// + 10000, which may be taken, or (above 55535) out of range.
	k.ports = []int{6379, 16379}
	k.cmd = func(p *plan, i int) []string {
		return append(redisKind.cmd(p, i), "--cluster-enabled", "yes", "--cluster-config-file", "/tmp/dlock-nodes.conf",
			"--cluster-port", strconv.Itoa(p.members[i].ports[1]))
	}
	ss, err := start(ctx, &k, 1)
	if err != nil {
		return nil, err
	}
	s := ss[0]
	cli := func(args ...string) (string, error) { return s.redisCLI(ctx, args...) }
	fail := func(err error) (*Server, error) {
		_ = s.Terminate(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("servers: redis cluster: %w", err)
	}
	if out, err := cli("CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil || !strings.Contains(out, "OK") {
		return fail(fmt.Errorf("CLUSTER ADDSLOTSRANGE: %q, %v", out, err))
	}
	if err := s.awaitCLI(ctx, "cluster_state:ok", "CLUSTER", "INFO"); err != nil {
		return fail(err)
	}
	return s, nil
}

// awaitCLI runs redis-cli args against s until its output contains want.
func (s *Server) awaitCLI(ctx context.Context, want string, args ...string) error {
	for deadline := time.Now().Add(startupTimeout); ; time.Sleep(50 * time.Millisecond) {
		out, err := s.redisCLI(ctx, args...)
		if err == nil && strings.Contains(out, want) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("redis-cli %s: no %q after %v: %q, %v", strings.Join(args, " "), want, startupTimeout, out, err)
		}
	}
}

// ErrNeedsHostNetwork is returned by set-ups that work only with host
// networking, in bridge mode.
var ErrNeedsHostNetwork = errors.New("needs host networking (" + envNetwork + "=" + networkHost + ")")

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
func StartRedisSentinel(ctx context.Context) (_ *RedisSentinel, err error) {
	const name = "dlock"
	if mode, err := networkMode(); err != nil {
		return nil, err
	} else if mode != networkHost {
		return nil, fmt.Errorf("servers: a Redis Sentinel set-up: %w", ErrNeedsHostNetwork)
	}
	r := &RedisSentinel{MasterName: name}
	defer func() {
		if err != nil {
			for _, s := range []*Server{r.Sentinel, r.Replica, r.Primary} {
				if s != nil {
					_ = s.Terminate(context.WithoutCancel(ctx))
				}
			}
			err = fmt.Errorf("servers: redis sentinel: %w", err)
		}
	}()
	ss, err := start(ctx, redisKind, 1)
	if err != nil {
		return nil, err
	}
	r.Primary = ss[0]
	primaryPort := strconv.Itoa(r.Primary.hostPort)

	replica := *redisKind
	replica.cmd = func(p *plan, i int) []string {
		return append(redisKind.cmd(p, i), "--replicaof", "127.0.0.1", primaryPort)
	}
	if ss, err = start(ctx, &replica, 1); err != nil {
		return nil, err
	}
	r.Replica = ss[0]
	if err := r.Replica.awaitCLI(ctx, "master_link_status:up", "INFO", "replication"); err != nil {
		return nil, err
	}

	// Sentinel rewrites its configuration file, so it is written by the
	// container's shell (as the user that runs the server) rather than
	// copied in.
	sentinel := *redisKind
	sentinel.cmd = func(p *plan, i int) []string {
		m := p.members[i]
		conf := strings.Join([]string{
			"sentinel monitor " + name + " 127.0.0.1 " + primaryPort + " 1",
			"sentinel down-after-milliseconds " + name + " 1000",
			"sentinel failover-timeout " + name + " 10000",
		}, "\n")
		return []string{"sh", "-c", "printf '" + conf + "\n' > /tmp/dlock-sentinel.conf && exec redis-server /tmp/dlock-sentinel.conf --sentinel" +
			" --port " + strconv.Itoa(m.ports[0]) + " --bind " + m.bind + " --protected-mode no"}
	}
	sentinel.readyLog = literal("+monitor master " + name)
	if ss, err = start(ctx, &sentinel, 1); err != nil {
		return nil, err
	}
	r.Sentinel = ss[0]
	replicaPort := strconv.Itoa(r.Replica.hostPort)
	if err := r.Sentinel.awaitCLI(ctx, replicaPort, "SENTINEL", "REPLICAS", name); err != nil {
		return nil, err
	}
	return r, nil
}

// redisCLI runs redis-cli in s's container against s, and returns its
// output.
func (s *Server) redisCLI(ctx context.Context, args ...string) (string, error) {
	port := strconv.Itoa(s.kind.ports[0]) // the port inside the container
	if s.host {
		port = strconv.Itoa(s.hostPort)
	}
	return s.exec(ctx, append([]string{"redis-cli", "-p", port}, args...)...)
}

// StartRedisTLS starts n independent Redis servers as [StartRedis] does,
// serving clients over TLS only (--port 0, the client port is the TLS
// port), without asking clients for a certificate. The servers'
// certificate, for 127.0.0.1 and localhost, is issued by a CA made for
// this call; its certificate is returned (PEM) for the clients to trust.
// The servers cannot be reached by redis-cli in plain text: set-ups that
// need it (awaitCLI) do not apply.
func StartRedisTLS(ctx context.Context, n int) ([]*Server, []byte, error) {
	const certFile, keyFile, caFile = "/etc/dlock-redis-server.pem", "/etc/dlock-redis-server-key.pem", "/etc/dlock-redis-ca.pem"
	ca, cert, key, err := newTLSCert()
	if err != nil {
		return nil, nil, err
	}
	k := *redisKind
	k.files = map[string][]byte{certFile: cert, keyFile: key, caFile: ca}
	k.cmd = func(p *plan, i int) []string {
		args := redisKind.cmd(p, i)
		for j := range args[:len(args)-1] {
			if args[j] == "--port" {
				args[j] = "--tls-port"
			}
		}
		return append(args, "--port", "0", "--tls-cert-file", certFile, "--tls-key-file", keyFile,
			"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	}
	ss, err := start(ctx, &k, n)
	if err != nil {
		return nil, nil, err
	}
	return ss, ca, nil
}
