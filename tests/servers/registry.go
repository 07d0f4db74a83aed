package servers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

var (
	registryMu sync.Mutex
	registry   = map[*Server]bool{} // every server this process started and not terminated

	networksMu sync.Mutex
	networks   = map[*testcontainers.DockerNetwork]bool{} // every network this process created and not removed
)

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

	clientMu.Lock()
	if dockerCli != nil {
		_ = dockerCli.Close()
		dockerCli = nil
	}
	clientMu.Unlock()
	return errors.Join(errs...)
}
