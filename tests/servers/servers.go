package servers

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/network"
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
	// createTimeout bounds the creation and start of one container (not
	// its readiness), which the caller's context does not cut.
	createTimeout = 2 * time.Minute
)

// kind describes one kind of server: everything the generic start path needs.
type kind struct {
	name         string // "redis"; also a container label
	imageEnv     string // environment variable naming the image
	defaultImage string

	// ports are the server's TCP ports inside the container in bridge mode.
	// ports[0] is the port clients dial ([Server.Addr]) and the only one
	// published to the host; the others (cluster peer ports) are used only
	// between members. In host mode every member gets its own free loopback
	// port for each entry instead.
	ports []int
	// cluster says that the servers of one start form a cluster: they are
	// started together, each one's command names all of them (see plan),
	// and in bridge mode they share a network of their own on which each
	// member is reachable under its name.
	cluster bool
	// cmd returns the full command line (argv, first element the program)
	// of member i of p. A kind whose servers are independent looks only at
	// p.members[i].
	cmd func(p *plan, i int) []string
	// readyLog returns a regular expression for the log line that member
	// i of p prints when it has become ready (it may depend on the group:
	// a ZooKeeper server alone says other things than an ensemble member).
	// Make it one that a start prints at least once when ready and never
	// before; printing it again later (after a re-election, say) is fine.
	readyLog func(p *plan, i int) string
	// stopSignal, if not empty, is the signal that [Server.Stop] sends
	// first (for example "SIGINT"), instead of the image's STOPSIGNAL
	// (SIGTERM unless the image says otherwise; stand-in images say nothing).
	stopSignal string
	// files are copied into each container before it starts: path in the
	// container → content (mode 0644).
	files map[string][]byte
	// faketime says that the server runs under libfaketime with its
	// realtime clock offset read from faketimeFile ([Server.ShiftClock]).
	faketime bool
}

// literal returns a kind.readyLog for a fixed line.
func literal(line string) func(*plan, int) string {
	re := regexp.QuoteMeta(line)
	return func(*plan, int) string { return re }
}

// plan is the layout of a group of servers started together, fixed before
// any of them starts so that cluster members can be told about each other.
// A kind whose servers are independent is started as groups of one.
type plan struct {
	id      string // random; unique to the group and start attempt (e.g. etcd's cluster token)
	members []member
}

// member is one server of a plan.
type member struct {
	name string // unique in the group: kind name and index ("etcd0"); the network alias in bridge mode
	bind string // address to listen on: 127.0.0.1 (host mode) or 0.0.0.0 (bridge mode)
	// host is the address the other members dial: 127.0.0.1 (host mode) or
	// name (bridge mode, on the group's network; cluster kinds only).
	host string
	// ports has one port per kind.ports entry: free loopback ports chosen up
	// front (host mode) or kind.ports itself (bridge mode).
	ports []int
}

func (k *kind) image() string {
	if img := os.Getenv(k.imageEnv); img != "" {
		return img
	}
	return k.defaultImage
}

// Server is one server running in a container. Its methods are safe for
// concurrent use, though fault controls (Stop, Start, Kill, Pause, Unpause,
// ShiftClock) are meant to be driven by one test at a time.
type Server struct {
	kind     *kind
	c        *testcontainers.DockerContainer
	host     bool           // host networking
	hostPort int            // host mode: the port chosen for clients (ports[0])
	ready    *regexp.Regexp // the ready line (kind.readyLog)

	mu   sync.Mutex
	addr string
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

// Stop stops the server gracefully (SIGTERM, or SIGINT for PostgreSQL, its
// fast shutdown; SIGKILL after 10s). The container is kept so that Start can
// bring the server back.
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
	// The container's log keeps the lines of earlier starts, and a server
	// may have printed its ready line more than once in one start: count
	// them while the server is down, and wait for one more.
	seen, err := s.readyLines(ctx)
	if err != nil {
		return err
	}
	if err := s.c.Start(ctx); err != nil {
		return fmt.Errorf("servers: start %s: %w", s.kind.name, err)
	}
	return s.awaitReady(ctx, seen+1)
}

// Kill kills the server with SIGKILL, as a crash would, and waits until its
// container has stopped. Start brings it back; whether its data survives
// depends on the kind: Redis servers run without persistence and come back
// empty (unless started with persistence by [StartRedisWithArgs]), etcd members, ZooKeeper servers and PostgreSQL servers keep their
// data directory.
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

// CPU returns the CPU time (user and system) that every process of the
// server's container has used since the container started, as the Docker
// engine accounts it; benchmarks take the difference of two readings.
func (s *Server) CPU(ctx context.Context) (time.Duration, error) {
	cli, err := dockerClient(ctx)
	if err != nil {
		return 0, err
	}
	res, err := cli.ContainerStats(ctx, s.c.GetContainerID(), client.ContainerStatsOptions{})
	if err != nil {
		return 0, fmt.Errorf("servers: stats of %s: %w", s, err)
	}
	defer res.Body.Close()
	var st container.StatsResponse
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		return 0, fmt.Errorf("servers: stats of %s: %w", s, err)
	}
	if st.CPUStats.CPUUsage.TotalUsage == 0 {
		return 0, fmt.Errorf("servers: stats of %s: no CPU usage reported", s)
	}
	return time.Duration(st.CPUStats.CPUUsage.TotalUsage), nil
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

// Terminate kills the server (no graceful shutdown: nothing of it is kept)
// and removes its container. Terminating twice is harmless.
func (s *Server) Terminate(ctx context.Context) error {
	if !forget(s) {
		return nil // terminated before
	}
	if err := s.c.Terminate(ctx, testcontainers.StopTimeout(0)); err != nil {
		remember(s) // for Main to try again
		return fmt.Errorf("servers: terminate %s: %w", s.kind.name, err)
	}
	return nil
}

// readyLines counts the ready lines in the container's log.
func (s *Server) readyLines(ctx context.Context) (int, error) {
	rc, err := s.c.Logs(ctx)
	if err != nil {
		return 0, fmt.Errorf("servers: %s: read the log: %w", s.kind.name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return 0, fmt.Errorf("servers: %s: read the log: %w", s.kind.name, err)
	}
	return len(s.ready.FindAllIndex(b, -1)), nil
}

// awaitReady waits until the container's log holds n ready lines and
// records the address to dial.
func (s *Server) awaitReady(ctx context.Context, n int) error {
	ready := wait.ForLog(s.ready.String()).AsRegexp().WithOccurrence(n).WithStartupTimeout(startupTimeout)
	if err := ready.WaitUntilReady(ctx, s.c); err != nil {
		return fmt.Errorf("servers: %s did not become ready: %w%s", s.kind.name, err, s.logTail(ctx))
	}

	var addr string
	if s.host {
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.hostPort))
	} else {
		// Re-read: a restarted container may be published on another port.
		p, err := s.c.MappedPort(ctx, strconv.Itoa(s.kind.ports[0])+"/tcp")
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
	b, _ := io.ReadAll(rc)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	if len(b) == 0 {
		return ""
	}
	return "\ncontainer log (end):\n" + string(b)
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

// prepare checks what starting servers of kind k needs and returns the
// network mode.
func prepare(ctx context.Context, k *kind) (string, error) {
	mode, err := networkMode()
	if err != nil {
		return "", err
	}
	if _, err := dockerClient(ctx); err != nil {
		return "", err
	}
	if err := checkImage(ctx, k.image()); err != nil {
		return "", err
	}
	return mode, nil
}

// start starts n independent servers of kind k (groups of one), in
// parallel. On error, servers already started are terminated.
func start(ctx context.Context, k *kind, n int) ([]*Server, error) {
	if n < 0 {
		return nil, fmt.Errorf("servers: start %d %s servers: negative count", n, k.name)
	}
	mode, err := prepare(ctx, k)
	if err != nil {
		return nil, err
	}
	gs := make([]*group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { gs[i], errs[i] = startGroup(ctx, k, mode, 1) })
	}
	wg.Wait()
	if err := joinDistinct(errs); err != nil {
		for _, g := range gs {
			if g != nil {
				_ = g.terminate(context.WithoutCancel(ctx))
			}
		}
		return nil, err
	}
	out := make([]*Server, n)
	for i, g := range gs {
		out[i] = g.servers[0]
	}
	return out, nil
}

// startCluster starts one cluster of n members of the cluster kind k.
func startCluster(ctx context.Context, k *kind, n int) (*group, error) {
	if n < 1 {
		return nil, fmt.Errorf("servers: start a %d-member %s cluster: need at least one member", n, k.name)
	}
	mode, err := prepare(ctx, k)
	if err != nil {
		return nil, err
	}
	return startGroup(ctx, k, mode, n)
}

// group is a set of servers started together: one independent server, or
// the members of one cluster.
type group struct {
	servers []*Server
	network *testcontainers.DockerNetwork // bridge mode, cluster kinds: the group's own network
}

// terminate terminates the group's servers, in parallel, and then removes
// its network. Servers that are nil (never started) are skipped.
func (g *group) terminate(ctx context.Context) error {
	errs := make([]error, len(g.servers)+1)
	var wg sync.WaitGroup
	for i, s := range g.servers {
		if s != nil {
			wg.Go(func() { errs[i] = s.Terminate(ctx) })
		}
	}
	wg.Wait()
	errs[len(g.servers)] = removeNetwork(ctx, g.network)
	return errors.Join(errs...)
}

// startGroup is the one way every test server is started: it starts a group
// of n servers of kind k together (n is 1 unless k is a cluster kind). In
// host mode a chosen port can be taken by someone else before the server
// binds it; the whole group is then started again on new ports, since
// cluster members name each other's ports.
func startGroup(ctx context.Context, k *kind, mode string, n int) (*group, error) {
	var lastErr error
	attempts := 1
	if mode == networkHost {
		attempts = hostPortAttempts
	}
	for range attempts {
		g, err := tryGroup(ctx, k, mode, n)
		if err == nil {
			return g, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// newPlan lays out a group of n servers of kind k.
func newPlan(k *kind, mode string, n int) (*plan, error) {
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	p := &plan{id: hex.EncodeToString(id[:]), members: make([]member, n)}
	for i := range p.members {
		m := member{name: k.name + strconv.Itoa(i)}
		if mode == networkHost {
			m.bind, m.host = "127.0.0.1", "127.0.0.1"
			for range k.ports {
				port, err := freePort()
				if err != nil {
					return nil, err
				}
				m.ports = append(m.ports, port)
			}
		} else {
			m.bind, m.host = "0.0.0.0", m.name
			m.ports = k.ports
		}
		p.members[i] = m
	}
	return p, nil
}

// tryGroup makes one attempt at starting a group. The members start in
// parallel: a cluster member is typically ready only once a quorum of its
// peers runs. The first failure cancels the others' start; on failure every
// member started is terminated.
func tryGroup(ctx context.Context, k *kind, mode string, n int) (*group, error) {
	p, err := newPlan(k, mode, n)
	if err != nil {
		return nil, err
	}
	g := &group{servers: make([]*Server, n)}
	if mode == networkBridge && k.cluster {
		// A network of the group's own, on which each member's name is its
		// alias (Docker's default bridge network has no aliases).
		nw, err := network.New(ctx, network.WithLabels(containerLabels(k)))
		if err != nil {
			if err := reaperMissing(err); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("servers: create a network for a %s cluster: %w", k.name, err)
		}
		g.network = nw
		rememberNetwork(nw)
	}
	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	failed := false
	var failMu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			s, err := tryStart(gctx, k, mode, p, i, g.network)
			if err != nil {
				failMu.Lock()
				failed = true
				failMu.Unlock()
				cancel(err)
				return
			}
			g.servers[i] = s
		})
	}
	wg.Wait()
	if failed {
		// The first failure, not the cancellations it caused.
		err := context.Cause(gctx)
		_ = g.terminate(context.WithoutCancel(ctx))
		return nil, err
	}
	return g, nil
}

// containerLabels returns the labels put on every container (and network)
// of kind k, by which leftovers are found.
func containerLabels(k *kind) map[string]string {
	startReaper() // before anything of this process exists to be reaped
	labels := map[string]string{"dlock.test": "1", "dlock.test.kind": k.name, ownerLabel: owner}
	if run := os.Getenv(envRun); run != "" {
		labels["dlock.test.run"] = run
	}
	return labels
}

// tryStart starts member i of plan p in a container and waits until it is
// ready. nw is the group's network (bridge mode, cluster kinds), else nil.
// On failure the container is terminated.
func tryStart(ctx context.Context, k *kind, mode string, p *plan, i int, nw *testcontainers.DockerNetwork) (*Server, error) {
	m := p.members[i]
	s := &Server{kind: k, host: mode == networkHost, ready: regexp.MustCompile(k.readyLog(p, i))}
	opts := []testcontainers.ContainerCustomizer{
		testcontainers.WithLabels(containerLabels(k)),
		testcontainers.WithCmd(k.cmd(p, i)...),
	}
	for path, b := range k.files { // fresh readers: a start may be retried
		opts = append(opts, testcontainers.WithFiles(testcontainers.ContainerFile{
			Reader: bytes.NewReader(b), ContainerFilePath: path, FileMode: 0o644,
		}))
	}
	if k.stopSignal != "" {
		opts = append(opts, testcontainers.WithConfigModifier(func(cfg *container.Config) {
			cfg.StopSignal = k.stopSignal
		}))
	}
	if s.host {
		s.hostPort = m.ports[0]
		opts = append(opts, testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.NetworkMode = networkHost
		}))
	} else {
		opts = append(opts, testcontainers.WithExposedPorts(strconv.Itoa(k.ports[0])+"/tcp"))
		if nw != nil {
			opts = append(opts, network.WithNetwork([]string{m.name}, nw))
		}
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	// The container is created and started on a context that the caller's
	// end does not cut: Docker may finish a create whose client has hung
	// up, and the container it made would then be held by no one (seen on
	// a CI run: a start cut after 100 ms left a container behind). The
	// caller's end is honoured once Run returns.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	c, err := testcontainers.Run(rctx, k.image(), opts...)
	rcancel()
	if c != nil {
		s.c = c
		remember(s)
	}
	if err == nil {
		err = context.Cause(ctx)
	}
	if err != nil {
		if c != nil {
			_ = s.Terminate(context.WithoutCancel(ctx))
		}
		if cause := context.Cause(ctx); cause != nil {
			return nil, cause
		}
		if err := reaperMissing(err); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("servers: start %s container (image %s): %w", k.name, k.image(), err)
	}
	if err := s.awaitReady(ctx, 1); err != nil {
		_ = s.Terminate(context.WithoutCancel(ctx))
		return nil, err
	}
	return s, nil
}

var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

// freePort returns a loopback TCP port that is free now, that this
// process has not handed out before, and that lies below the kernel's
// ephemeral range (staticPorts). A server stopped and started again binds
// its port again; a port of the ephemeral range may meanwhile have become
// the local port of any outgoing connection on the machine (seen in CI: a
// restarted Redis failed with "bind: Address already in use").
func freePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi := staticPorts()
	for range 1000 {
		port := lo + mrand.IntN(hi-lo)
		if portsUsed[port] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // in use
		}
		_ = l.Close()
		portsUsed[port] = true
		return port, nil
	}
	return 0, errors.New("servers: choose a free port: no unused port found")
}

// staticPorts is the range [lo, hi) freePort draws from: from 10000 up to
// the start of the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range,
// 32768 if it cannot be read), or from 1024 if that range starts lower.
func staticPorts() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 2048 {
				hi = n
			}
		}
	}
	lo = 10000
	if hi-lo < 1000 {
		lo = 1024
	}
	return lo, hi
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

// reaperMissing returns a missingError if err (from starting a container or
// creating a network) says that the Ryuk reaper could not be started, else
// nil.
func reaperMissing(err error) error {
	if !strings.Contains(err.Error(), "reaper") {
		return nil
	}
	return &missingError{
		what: "the testcontainers Ryuk reaper cannot run (set TESTCONTAINERS_RYUK_DISABLED=true)",
		err:  err,
	}
}

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
