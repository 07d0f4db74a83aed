package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Environment variables read by this package; see the package documentation.
const (
	envNetwork = "DLOCK_TEST_NETWORK"
	envRequire = "DLOCK_REQUIRE_SERVERS"
	envRun     = "DLOCK_TEST_RUN"
)

const (
	networkBridge = "bridge"
	networkHost   = "host"

	startupTimeout = 90 * time.Second
	stopTimeout    = 10 * time.Second
	// hostPortAttempts bounds retries when a chosen host port was taken by
	// someone else between choosing it and the server binding it.
	hostPortAttempts = 3
)

// kind describes one kind of server: everything the generic start path needs.
type kind struct {
	name         string // "redis"; also a container label
	imageEnv     string // environment variable naming the image
	defaultImage string
	port         int // the server's port inside the container in bridge mode

	// cmd returns the full command line (argv, first element the program)
	// that makes the server listen on bindAddr:port.
	cmd func(bindAddr string, port int) []string
	// readyLog is the log line the server prints each time it is ready.
	readyLog string
}

func (k *kind) image() string {
	if img := os.Getenv(k.imageEnv); img != "" {
		return img
	}
	return k.defaultImage
}

// Server is one server running in a container. Its methods are safe for
// concurrent use, though fault controls (Stop, Start, Kill, Pause, Unpause)
// are meant to be driven by one test at a time.
type Server struct {
	kind     *kind
	c        *testcontainers.DockerContainer
	host     bool // host networking
	hostPort int  // host mode: the port chosen for the server

	mu     sync.Mutex
	addr   string
	starts int // how many times the server has been started (ready lines to wait for)
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
	return s.kind.name + "@" + s.Addr()
}

// Stop stops the server gracefully (SIGTERM, SIGKILL after 10s). The
// container is kept so that Start can bring the server back.
func (s *Server) Stop(ctx context.Context) error {
	timeout := stopTimeout
	if err := s.c.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("servers: stop %s: %w", s.kind.name, err)
	}
	return nil
}

// Start starts the server again after Stop or Kill and waits until it is
// ready. In host mode it listens on the same port as before; in bridge mode
// the published port may change and Addr reports the new one.
func (s *Server) Start(ctx context.Context) error {
	if err := s.c.Start(ctx); err != nil {
		return fmt.Errorf("servers: start %s: %w", s.kind.name, err)
	}
	return s.awaitReady(ctx)
}

// Kill kills the server with SIGKILL, as a crash would, and waits until its
// container has stopped. Start brings it back (without any data).
func (s *Server) Kill(ctx context.Context) error {
	cli, err := dockerClient(ctx)
	if err != nil {
		return err
	}
	if _, err := cli.ContainerKill(ctx, s.c.GetContainerID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		return fmt.Errorf("servers: kill %s: %w", s.kind.name, err)
	}
	res := cli.ContainerWait(ctx, s.c.GetContainerID(), client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case <-res.Result:
		return nil
	case err := <-res.Error:
		return fmt.Errorf("servers: kill %s: wait for exit: %w", s.kind.name, err)
	case <-ctx.Done():
		return fmt.Errorf("servers: kill %s: %w", s.kind.name, ctx.Err())
	}
}

// Pause freezes every process of the server (docker pause): connections stay
// open but nothing is answered, as with a stalled machine or a partition.
func (s *Server) Pause(ctx context.Context) error {
	cli, err := dockerClient(ctx)
	if err != nil {
		return err
	}
	if _, err := cli.ContainerPause(ctx, s.c.GetContainerID(), client.ContainerPauseOptions{}); err != nil {
		return fmt.Errorf("servers: pause %s: %w", s.kind.name, err)
	}
	return nil
}

// Unpause resumes a server frozen by Pause.
func (s *Server) Unpause(ctx context.Context) error {
	cli, err := dockerClient(ctx)
	if err != nil {
		return err
	}
	if _, err := cli.ContainerUnpause(ctx, s.c.GetContainerID(), client.ContainerUnpauseOptions{}); err != nil {
		return fmt.Errorf("servers: unpause %s: %w", s.kind.name, err)
	}
	return nil
}

// Terminate stops the server and removes its container. Terminating twice is
// harmless.
func (s *Server) Terminate(ctx context.Context) error {
	forget(s)
	if err := s.c.Terminate(ctx); err != nil {
		return fmt.Errorf("servers: terminate %s: %w", s.kind.name, err)
	}
	return nil
}

// awaitReady waits for the server's ready line of the current start and
// records the address to dial.
func (s *Server) awaitReady(ctx context.Context) error {
	s.mu.Lock()
	s.starts++
	n := s.starts
	s.mu.Unlock()

	// The container's log keeps the lines of earlier starts: wait for the
	// n-th ready line.
	ready := wait.ForLog(s.kind.readyLog).WithOccurrence(n).WithStartupTimeout(startupTimeout)
	if err := ready.WaitUntilReady(ctx, s.c); err != nil {
		return fmt.Errorf("servers: %s did not become ready: %w%s", s.kind.name, err, s.logTail(ctx))
	}

	var addr string
	if s.host {
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.hostPort))
	} else {
		// Re-read: a restarted container may be published on another port.
		p, err := s.c.MappedPort(ctx, strconv.Itoa(s.kind.port)+"/tcp")
		if err != nil {
			return fmt.Errorf("servers: %s: published port: %w", s.kind.name, err)
		}
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(p.Num())))
	}
	s.mu.Lock()
	s.addr = addr
	s.mu.Unlock()
	return nil
}

// logTail returns the end of the container's log, for error messages.
func (s *Server) logTail(ctx context.Context) string {
	rc, err := s.c.Logs(ctx)
	if err != nil {
		return ""
	}
	defer rc.Close()
	buf := make([]byte, 64<<10)
	n, _ := readFull(rc, buf)
	b := buf[:n]
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	if len(b) == 0 {
		return ""
	}
	return "\ncontainer log (end):\n" + string(b)
}

func readFull(r interface{ Read([]byte) (int, error) }, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// networkMode returns the configured network mode.
func networkMode() (string, error) {
	switch v := os.Getenv(envNetwork); v {
	case "", networkBridge:
		return networkBridge, nil
	case networkHost:
		return networkHost, nil
	default:
		return "", fmt.Errorf("servers: %s=%q: want %q or %q", envNetwork, v, networkBridge, networkHost)
	}
}

// start starts n servers of kind k, in parallel. On error, servers already
// started are terminated.
func start(ctx context.Context, k *kind, n int) ([]*Server, error) {
	if n < 0 {
		return nil, fmt.Errorf("servers: start %d %s servers: negative count", n, k.name)
	}
	mode, err := networkMode()
	if err != nil {
		return nil, err
	}
	if _, err := dockerClient(ctx); err != nil {
		return nil, err
	}
	if err := checkImage(ctx, k.image()); err != nil {
		return nil, err
	}
	out := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = startOne(ctx, k, mode) })
	}
	wg.Wait()
	if err := joinDistinct(errs); err != nil {
		for _, s := range out {
			if s != nil {
				_ = s.Terminate(context.WithoutCancel(ctx))
			}
		}
		return nil, err
	}
	return out, nil
}

// startOne is the one way every test server is started.
func startOne(ctx context.Context, k *kind, mode string) (*Server, error) {
	var lastErr error
	attempts := 1
	if mode == networkHost {
		attempts = hostPortAttempts
	}
	for range attempts {
		s, err := tryStart(ctx, k, mode)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func tryStart(ctx context.Context, k *kind, mode string) (*Server, error) {
	labels := map[string]string{"dlock.test": "1", "dlock.test.kind": k.name}
	if run := os.Getenv(envRun); run != "" {
		labels["dlock.test.run"] = run
	}
	s := &Server{kind: k, host: mode == networkHost}
	opts := []testcontainers.ContainerCustomizer{testcontainers.WithLabels(labels)}
	if s.host {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s.hostPort = port
		opts = append(opts,
			testcontainers.WithCmd(k.cmd("127.0.0.1", port)...),
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
				hc.NetworkMode = networkHost
			}),
		)
	} else {
		opts = append(opts,
			testcontainers.WithCmd(k.cmd("0.0.0.0", k.port)...),
			testcontainers.WithExposedPorts(strconv.Itoa(k.port)+"/tcp"),
		)
	}
	c, err := testcontainers.Run(ctx, k.image(), opts...)
	if c != nil {
		s.c = c
		remember(s)
	}
	if err != nil {
		if c != nil {
			_ = s.Terminate(context.WithoutCancel(ctx))
		}
		if strings.Contains(err.Error(), "reaper") {
			return nil, &missingError{
				what: "the testcontainers Ryuk reaper cannot run (set TESTCONTAINERS_RYUK_DISABLED=true)",
				err:  err,
			}
		}
		return nil, fmt.Errorf("servers: start %s container (image %s): %w", k.name, k.image(), err)
	}
	if err := s.awaitReady(ctx); err != nil {
		_ = s.Terminate(context.WithoutCancel(ctx))
		return nil, err
	}
	return s, nil
}

var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

// freePort returns a loopback TCP port that is free now and that this
// process has not handed out before.
func freePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("servers: choose a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !portsUsed[port] {
			portsUsed[port] = true
			return port, nil
		}
	}
	return 0, errors.New("servers: choose a free port: no unused port found")
}

var (
	clientMu  sync.Mutex
	dockerCli *testcontainers.DockerClient
)

// dockerClient returns a shared Docker API client, or an error saying that
// no Docker engine is reachable.
func dockerClient(ctx context.Context) (*testcontainers.DockerClient, error) {
	clientMu.Lock()
	defer clientMu.Unlock()
	if dockerCli != nil {
		return dockerCli, nil
	}
	cli, err := newDockerClient(ctx)
	if err != nil {
		return nil, &missingError{what: "no Docker engine reachable", err: err}
	}
	dockerCli = cli
	return cli, nil
}

func newDockerClient(ctx context.Context) (cli *testcontainers.DockerClient, err error) {
	// Guard against a panic from the engine discovery code.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	cli, err = testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := cli.Ping(ctx, client.PingOptions{}); err != nil {
		_ = cli.Close()
		return nil, err
	}
	return cli, nil
}

// checkImage reports an image that is neither present nor pullable as a
// missing resource, with a hint.
func checkImage(ctx context.Context, image string) error {
	cli, err := dockerClient(ctx)
	if err != nil {
		return err
	}
	if _, err := cli.ImageInspect(ctx, image); err == nil {
		return nil
	}
	pullCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	rc, err := cli.ImagePull(pullCtx, image, client.ImagePullOptions{})
	if err == nil {
		err = rc.Wait(pullCtx)
		_ = rc.Close()
	}
	if err != nil {
		return &missingError{
			what: fmt.Sprintf("image %s is not present and cannot be pulled (scripts/test.sh builds a stand-in)", image),
			err:  err,
		}
	}
	return nil
}

// missingError reports that something a test server needs is missing: tests
// skip on it unless DLOCK_REQUIRE_SERVERS=1.
type missingError struct {
	what string
	err  error
}

func (e *missingError) Error() string { return "servers: " + e.what + ": " + e.err.Error() }
func (e *missingError) Unwrap() error { return e.err }

// joinDistinct joins errs, leaving out nils and repeated messages (parallel
// starts tend to fail the same way).
func joinDistinct(errs []error) error {
	seen := map[string]bool{}
	var out []error
	for _, err := range errs {
		if err == nil || seen[err.Error()] {
			continue
		}
		seen[err.Error()] = true
		out = append(out, err)
	}
	return errors.Join(out...)
}
