package servers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

var (
	registryMu sync.Mutex
	registry   = map[*Server]bool{} // every server this process started and not terminated

	networksMu sync.Mutex
	networks   = map[*testcontainers.DockerNetwork]bool{} // every network this process created and not removed

	sharedMu       sync.Mutex
	sharedSets     = map[*kind][]*Server{}
	sharedErrs     = map[*kind]error{} // first failure; later calls give up at once
	sharedClusters = map[clusterKey]any{}
	sharedClErrs   = map[clusterKey]error{}
)

// clusterKey names a shared cluster: a test package has one per kind and
// size.
type clusterKey struct {
	k *kind
	n int
}

func remember(s *Server) {
	registryMu.Lock()
	registry[s] = true
	registryMu.Unlock()
}

// forget removes s from the registry and reports whether it was there.
func forget(s *Server) bool {
	registryMu.Lock()
	defer registryMu.Unlock()
	was := registry[s]
	delete(registry, s)
	return was
}

func rememberNetwork(nw *testcontainers.DockerNetwork) {
	networksMu.Lock()
	networks[nw] = true
	networksMu.Unlock()
}

// removeNetwork removes nw (if not nil and not removed before).
func removeNetwork(ctx context.Context, nw *testcontainers.DockerNetwork) error {
	if nw == nil {
		return nil
	}
	networksMu.Lock()
	mine := networks[nw]
	delete(networks, nw)
	networksMu.Unlock()
	if !mine {
		return nil
	}
	if err := nw.Remove(ctx); err != nil {
		return fmt.Errorf("servers: remove network %s: %w", nw.Name, err)
	}
	return nil
}

// shared returns the first n servers of the package's shared set of kind k,
// starting what is missing.
func shared(tb testing.TB, k *kind, n int) []*Server {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	err := sharedErrs[k]
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

// sharedCluster returns the test package's shared n-member cluster of the
// cluster kind k, starting it on first use; wrap makes the kind's cluster
// type from the started group. Clusters of different sizes are separate.
func sharedCluster[C any](tb testing.TB, k *kind, n int, wrap func(*group) C) C {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	key := clusterKey{k, n}
	if c, ok := sharedClusters[key]; ok {
		return c.(C)
	}
	err := sharedClErrs[key]
	if err == nil {
		// Not tb.Context(): the cluster outlives the test that started it.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		g, startErr := startCluster(ctx, k, n)
		cancel()
		if startErr == nil {
			c := wrap(g)
			sharedClusters[key] = c
			return c
		}
		err = startErr
		sharedClErrs[key] = err
	}
	giveUp(tb, fmt.Sprintf("a %d-member %s cluster", n, k.name), err)
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
	var missing *missingError
	if errors.As(err, &missing) {
		tb.Skipf("%s\n(skipping; set %s=1 to fail instead, or run scripts/test.sh, which provides Docker and images)", msg, envRequire)
	}
	tb.Skipf("%s\n(skipping; set %s=1 to fail instead)", msg, envRequire)
}

// Main runs the package's tests and then removes every container (and
// cluster network) this package started in the process, shared or not, and
// exits with the tests' exit code. Use it as the package's TestMain:
//
//	func TestMain(m *testing.M) { servers.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if err := terminateAll(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// terminateAll terminates every server still registered, removes every
// network still registered, and closes the shared Docker client.
func terminateAll() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	registryMu.Lock()
	all := make([]*Server, 0, len(registry))
	for s := range registry {
		all = append(all, s)
	}
	registryMu.Unlock()

	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, s := range all {
		wg.Go(func() { errs[i] = s.Terminate(ctx) })
	}
	wg.Wait()

	networksMu.Lock()
	nws := make([]*testcontainers.DockerNetwork, 0, len(networks))
	for nw := range networks {
		nws = append(nws, nw)
	}
	networksMu.Unlock()
	for _, nw := range nws {
		errs = append(errs, removeNetwork(ctx, nw))
	}

	sharedMu.Lock()
	clear(sharedSets)
	clear(sharedErrs)
	clear(sharedClusters)
	clear(sharedClErrs)
	sharedMu.Unlock()

	clientMu.Lock()
	if dockerCli != nil {
		_ = dockerCli.Close()
		dockerCli = nil
	}
	clientMu.Unlock()
	return errors.Join(errs...)
}
