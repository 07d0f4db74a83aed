package servers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

var (
	sharedMu       sync.Mutex
	sharedSets     = map[*kind][]*Server{}
	sharedErrs     = map[*kind]error{} // first failure; later calls give up at once
	sharedClusters = map[clusterKey]any{}
	sharedClErrs   = map[clusterKey]error{}
)

// clusterKey names a shared cluster: a test package has one per kind
// ("etcd", "zookeeper-tls") and size.
type clusterKey struct {
	kind string
	n    int
}

// shared returns the first n servers of the package's shared set of kind
// k, starting what is missing.
func shared(tb testing.TB, k *kind, n int) []*Server {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	err := sharedErrs[k]
	if err == nil && n < 0 {
		err = fmt.Errorf("servers: start %d %s servers: negative count", n, k.name)
	}
	if err == nil && len(sharedSets[k]) < n {
		// Not tb.Context(): the servers outlive the test that started them.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		more, startErr := start(ctx, k, n-len(sharedSets[k]))
		cancel()
		if startErr != nil {
			err = startErr
			sharedErrs[k] = err
		} else {
			sharedSets[k] = append(sharedSets[k], more...)
		}
	}
	if err != nil {
		giveUp(tb, fmt.Sprintf("%d %s server(s)", n, k.name), err)
		return nil
	}
	return sharedSets[k][:n:n]
}

// sharedCluster returns the test package's shared n-member cluster named
// name, starting it with start on first use. Clusters of different sizes
// are separate.
func sharedCluster[C any](tb testing.TB, name string, n int, start func(context.Context, int) (C, error)) C {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	key := clusterKey{name, n}
	if c, ok := sharedClusters[key]; ok {
		return c.(C)
	}
	err := sharedClErrs[key]
	if err == nil {
		// Not tb.Context(): the cluster outlives the test that started it.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		c, startErr := start(ctx, n)
		cancel()
		if startErr == nil {
			sharedClusters[key] = c
			return c
		}
		err = startErr
		sharedClErrs[key] = err
	}
	giveUp(tb, fmt.Sprintf("a %d-member %s cluster", n, name), err)
	var zero C
	return zero
}

// giveUp skips or fails tb because servers (what) could not be started.
func giveUp(tb testing.TB, what string, err error) {
	tb.Helper()
	msg := fmt.Sprintf("cannot start %s: %v", what, err)
	if os.Getenv(envRequire) == "1" {
		tb.Fatalf("%s\n(%s=1: servers are required)", msg, envRequire)
	}
	if isMissing(err) {
		tb.Skipf("%s\n(skipping; set %s=1 to fail instead, or run scripts/test.sh, which provides Docker and images)", msg, envRequire)
	}
	tb.Skipf("%s\n(skipping; set %s=1 to fail instead)", msg, envRequire)
}

// isMissing reports whether err says that something the servers need is
// missing (Docker, an image).
func isMissing(err error) bool {
	var m *missingError
	return errors.As(err, &m)
}

// Main runs the package's tests and then removes every container (and
// cluster network) this package started in the process, shared or not, and
// exits with the tests' exit code. Use it as the package's TestMain:
//
//	func TestMain(m *testing.M) { servers.Main(m) }
//
// (A test process that dies before that leaves nothing behind either: its
// reaper removes its containers when the process ends; see the package
// documentation.)
func Main(m *testing.M) {
	code := m.Run()
	sharedMu.Lock()
	clear(sharedSets)
	clear(sharedErrs)
	clear(sharedClusters)
	clear(sharedClErrs)
	sharedMu.Unlock()
	err := terminateAll()
	stopReaper()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// Redis returns the first n servers of the test package's shared set of
// Redis servers (independent masters, no persistence), starting what is
// missing. The servers are shared by the package's tests, so a test must
// not stop, kill or pause them, and should use keys of its own; tests that
// inject faults start their own with [StartRedis]. If the servers cannot
// be started the test is skipped, or failed with DLOCK_REQUIRE_SERVERS=1.
func Redis(tb testing.TB, n int) []*Server {
	tb.Helper()
	return shared(tb, redisKind, n)
}

// RedisTLS starts n Redis servers that accept only TLS connections, with
// a certificate of a CA of their own, for tb alone (terminated when it
// ends), and returns them and the CA certificate (PEM). It skips or fails
// tb as [Redis] does.
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

// Etcd returns the test package's shared n-member etcd cluster, starting
// it on first use (clusters of different sizes are separate). As with
// [Redis], tests must not inject faults into it: they start their own with
// [StartEtcd].
func Etcd(tb testing.TB, n int) *EtcdCluster {
	tb.Helper()
	return sharedCluster(tb, "etcd", n, StartEtcd)
}

// ZooKeeper returns the test package's shared n-member ZooKeeper ensemble,
// starting it on first use. As with [Redis], tests must not inject faults
// into it: they start their own with [StartZooKeeper].
func ZooKeeper(tb testing.TB, n int) *ZooKeeperEnsemble {
	tb.Helper()
	return sharedCluster(tb, "zookeeper", n, StartZooKeeper)
}

// ZooKeeperTLS returns the test package's shared n-member ZooKeeper
// ensemble that accepts only TLS clients (its CA in CAPEM), starting it
// on first use.
func ZooKeeperTLS(tb testing.TB, n int) *ZooKeeperEnsemble {
	tb.Helper()
	return sharedCluster(tb, "zookeeper-tls", n, StartZooKeeperTLS)
}

// Postgres returns the test package's shared PostgreSQL server, starting
// it on first use.
func Postgres(tb testing.TB) *Server {
	tb.Helper()
	srvs := shared(tb, postgresKind, 1)
	if len(srvs) == 0 {
		return nil // tb was skipped or failed
	}
	return srvs[0]
}

// PostgresURL returns a connection URL for the PostgreSQL server s (user
// postgres, no password, database postgres, no TLS).
func PostgresURL(s *Server) string {
	return "postgres://postgres@" + s.Addr() + "/postgres?sslmode=disable"
}
