package servers

import (
	"context"
	"strconv"
	"testing"
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
