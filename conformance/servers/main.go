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
	registryMu sync.Mutex
	registry   = map[*Server]bool{} // every server this process started and not terminated

	sharedMu   sync.Mutex
	sharedSets = map[*kind][]*Server{}
	sharedErrs = map[*kind]error{} // first failure; later calls give up at once
)

func remember(s *Server) {
	registryMu.Lock()
	registry[s] = true
	registryMu.Unlock()
}

func forget(s *Server) {
	registryMu.Lock()
	delete(registry, s)
	registryMu.Unlock()
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
		giveUp(tb, k, n, err)
		return nil
	}
	return sharedSets[k][:n:n]
}

// giveUp skips or fails tb because servers could not be started.
func giveUp(tb testing.TB, k *kind, n int, err error) {
	tb.Helper()
	msg := fmt.Sprintf("cannot start %d %s server(s): %v", n, k.name, err)
	if os.Getenv(envRequire) == "1" {
		tb.Fatalf("%s\n(%s=1: servers are required)", msg, envRequire)
	}
	var missing *missingError
	if errors.As(err, &missing) {
		tb.Skipf("%s\n(skipping; set %s=1 to fail instead, or run scripts/test.sh, which provides Docker and images)", msg, envRequire)
	}
	tb.Skipf("%s\n(skipping; set %s=1 to fail instead)", msg, envRequire)
}

// Main runs the package's tests and then removes every container this
// package started in the process, shared or not, and exits with the tests'
// exit code. Use it as the package's TestMain:
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

// terminateAll terminates every server still registered and closes the
// shared Docker client.
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

	sharedMu.Lock()
	clear(sharedSets)
	clear(sharedErrs)
	sharedMu.Unlock()

	clientMu.Lock()
	if dockerCli != nil {
		_ = dockerCli.Close()
		dockerCli = nil
	}
	clientMu.Unlock()
	return errors.Join(errs...)
}
