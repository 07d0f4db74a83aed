package servers

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	tcexec "github.com/testcontainers/testcontainers-go/exec"
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
	k.cmd = func(p *plan, i int) []string {
		return append(redisKind.cmd(p, i), "--cluster-enabled", "yes", "--cluster-config-file", "/tmp/dlock-nodes.conf")
	}
	ss, err := start(ctx, &k, 1)
	if err != nil {
		return nil, err
	}
	s := ss[0]
	port := strconv.Itoa(k.ports[0]) // the port inside the container
	if s.host {
		port = strconv.Itoa(s.hostPort)
	}
	cli := func(args ...string) (string, error) {
		code, r, err := s.c.Exec(ctx, append([]string{"redis-cli", "-p", port}, args...), tcexec.Multiplexed())
		if err != nil {
			return "", err
		}
		out, err := io.ReadAll(r)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit status %d", code)
		}
		return string(out), err
	}
	fail := func(err error) (*Server, error) {
		_ = s.Terminate(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("servers: redis cluster: %w", err)
	}
	if out, err := cli("CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil || !strings.Contains(out, "OK") {
		return fail(fmt.Errorf("CLUSTER ADDSLOTSRANGE: %q, %v", out, err))
	}
	for deadline := time.Now().Add(startupTimeout); ; time.Sleep(50 * time.Millisecond) {
		out, err := cli("CLUSTER", "INFO")
		if err == nil && strings.Contains(out, "cluster_state:ok") {
			return s, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fail(fmt.Errorf("cluster state not ok after %v: %q, %v", startupTimeout, out, err))
		}
	}
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
	return shared(tb, redisKind, n)
}
