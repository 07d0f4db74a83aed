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

// Environment variables read by this package (the others are read by
// serverd); see the package documentation.
const (
	envNetwork = "DLOCK_TEST_NETWORK"
	envRequire = "DLOCK_REQUIRE_SERVERS"
)

// Server is one server running in a container. Its methods are safe for
// concurrent use, though fault controls (Stop, Start, Kill, Pause, Unpause,
// ShiftClock) are meant to be driven by one test at a time.
type Server struct {
	id   string // serverd's
	kind string

	mu   sync.Mutex
	addr string
}

func newServer(si serverInfo) *Server {
	return &Server{id: si.ID, kind: si.Kind, addr: si.Addr}
}

// Addr returns the host:port to dial from the test process (always
// 127.0.0.1). In bridge mode the port may change when the server is started
// again; call Addr again after [Server.Start].
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// String returns a short description for test logs.
func (s *Server) String() string {
	return s.kind + "@" + s.Addr()
}

// do runs the operation op on s in serverd.
func (s *Server) do(ctx context.Context, op string) (response, error) {
	return call(ctx, request{Op: op, Server: s.id})
}

// Stop stops the server gracefully (SIGTERM, or SIGINT for PostgreSQL, its
// fast shutdown; SIGKILL after 10s). The container is kept so that Start can
// bring the server back.
func (s *Server) Stop(ctx context.Context) error {
	_, err := s.do(ctx, "stop")
	return err
}

// Start starts the server again after Stop or Kill and waits until it is
// ready. In host mode it listens on the same port as before; in bridge mode
// the published port may change and Addr reports the new one.
func (s *Server) Start(ctx context.Context) error {
	resp, err := s.do(ctx, "start")
	if resp.Addr != "" {
		s.mu.Lock()
		s.addr = resp.Addr
		s.mu.Unlock()
	}
	return err
}

// Kill kills the server with SIGKILL, as a crash would, and waits until its
// container has stopped. Start brings it back; whether its data survives
// depends on the kind: Redis servers run without persistence and come back
// empty (unless started with persistence by [StartRedisWithArgs]), etcd
// members, ZooKeeper servers and PostgreSQL servers keep their data
// directory.
func (s *Server) Kill(ctx context.Context) error {
	_, err := s.do(ctx, "kill")
	return err
}

// Pause freezes every process of the server (docker pause): connections stay
// open but nothing is answered, as with a stalled machine or a partition.
func (s *Server) Pause(ctx context.Context) error {
	_, err := s.do(ctx, "pause")
	return err
}

// Unpause resumes a server frozen by Pause.
func (s *Server) Unpause(ctx context.Context) error {
	_, err := s.do(ctx, "unpause")
	return err
}

// Terminate kills the server (no graceful shutdown: nothing of it is kept)
// and removes its container. Terminating twice is harmless.
func (s *Server) Terminate(ctx context.Context) error {
	_, err := s.do(ctx, "terminate")
	return err
}

// startServers asks serverd for new servers of kind (a serverd kind name).
func startServers(ctx context.Context, kind string, n int, args ...string) ([]*Server, error) {
	resp, err := call(ctx, request{Op: "new", Kind: kind, N: n, Args: args})
	if err != nil {
		return nil, err
	}
	out := make([]*Server, len(resp.Servers))
	for i, si := range resp.Servers {
		out[i] = newServer(si)
	}
	return out, nil
}

// group is a cluster started together, as serverd knows it.
type group struct {
	id      string
	servers []*Server
	caPEM   []byte
}

// startCluster asks serverd for one cluster of n members of kind.
func startCluster(ctx context.Context, kind string, n int) (*group, error) {
	resp, err := call(ctx, request{Op: "new", Kind: kind, N: n})
	if err != nil {
		return nil, err
	}
	g := &group{id: resp.Group, caPEM: resp.CAPEM}
	for _, si := range resp.Servers {
		g.servers = append(g.servers, newServer(si))
	}
	return g, nil
}

func (g *group) terminate(ctx context.Context) error {
	_, err := call(ctx, request{Op: "terminategroup", Group: g.id})
	return err
}

var (
	sharedMu       sync.Mutex
	sharedSets     = map[string][]*Server{}
	sharedErrs     = map[string]error{} // first failure; later calls give up at once
	sharedClusters = map[clusterKey]any{}
	sharedClErrs   = map[clusterKey]error{}
)

// clusterKey names a shared cluster: a test package has one per kind and
// size.
type clusterKey struct {
	kind string
	n    int
}

// shared returns the first n servers of the package's shared set of kind,
// starting what is missing.
func shared(tb testing.TB, kind string, n int) []*Server {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	err := sharedErrs[kind]
	if err == nil && n < 0 {
		err = fmt.Errorf("servers: start %d %s servers: negative count", n, kind)
	}
	if err == nil && len(sharedSets[kind]) < n {
		// Not tb.Context(): the servers outlive the test that started them.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		more, startErr := startServers(ctx, kind, n-len(sharedSets[kind]))
		cancel()
		if startErr != nil {
			err = startErr
			sharedErrs[kind] = err
		} else {
			sharedSets[kind] = append(sharedSets[kind], more...)
		}
	}
	if err != nil {
		giveUp(tb, fmt.Sprintf("%d %s server(s)", n, kind), err)
		return nil
	}
	return sharedSets[kind][:n:n]
}

// sharedCluster returns the test package's shared n-member cluster of the
// cluster kind, starting it on first use; wrap makes the kind's cluster
// type from the started group. Clusters of different sizes are separate.
func sharedCluster[C any](tb testing.TB, kind string, n int, wrap func(*group) C) C {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	key := clusterKey{kind, n}
	if c, ok := sharedClusters[key]; ok {
		return c.(C)
	}
	err := sharedClErrs[key]
	if err == nil {
		// Not tb.Context(): the cluster outlives the test that started it.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		g, startErr := startCluster(ctx, kind, n)
		cancel()
		if startErr == nil {
			c := wrap(g)
			sharedClusters[key] = c
			return c
		}
		err = startErr
		sharedClErrs[key] = err
	}
	giveUp(tb, fmt.Sprintf("a %d-member %s cluster", n, kind), err)
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

// Main runs the package's tests and then removes every container (and
// cluster network) this package started in the process, shared or not, and
// exits with the tests' exit code. Use it as the package's TestMain:
//
//	func TestMain(m *testing.M) { servers.Main(m) }
//
// (A test process that dies before that leaves nothing behind either:
// serverd removes everything when its input, from the test process, ends.)
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

// terminateAll stops this process's serverd, if it runs, which terminates
// every server and removes every network it started.
func terminateAll() error {
	daemonMu.Lock()
	d := theDaemon
	theDaemon, daemonErr = nil, nil
	daemonMu.Unlock()

	sharedMu.Lock()
	clear(sharedSets)
	clear(sharedErrs)
	clear(sharedClusters)
	clear(sharedClErrs)
	sharedMu.Unlock()

	if d == nil {
		return nil
	}
	return d.stop()
}

// ErrNeedsHostNetwork is returned by set-ups that work only with host
// networking, in bridge mode.
var ErrNeedsHostNetwork = errors.New("needs host networking (" + envNetwork + "=host)")
