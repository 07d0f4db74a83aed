// Command serverd starts and controls dlock's test servers in containers,
// with testcontainers-go, on behalf of the package
// github.com/dlock-go/dlock/conformance/servers, which starts one serverd
// per test process and talks to it over its standard input and output.
// It is a separate module so that testcontainers-go and its dependencies
// (the Docker client, containerd, OpenTelemetry, ...) stay out of the
// go.mod of every library module: the servers package itself uses only the
// standard library.
//
// # Protocol
//
// Requests and responses are JSON objects, one per line (see [request] and
// [response]). Every request carries an id that its response repeats;
// requests are served concurrently, so responses come in any order. A
// request's deadline (unix nanoseconds, 0 for none) bounds its work, and a
// "cancel" request ends the work of an earlier one.
//
// When its standard input ends (the test process closed it, or died),
// serverd cancels whatever is in flight, terminates every container it
// started and removes every network it created, and exits (status 1 if
// some could not be removed). It ignores SIGINT, which an interactive ^C
// sends to the whole process group: the test process dies of it and the
// end of input follows; SIGTERM is handled like the end of input. It
// ignores SIGPIPE too: its output or standard error may be gone by then.
//
// The servers' configuration comes from the environment, as documented by
// the servers package (DLOCK_REDIS_IMAGE, DLOCK_TEST_NETWORK, ...).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// request is one line of serverd's input.
type request struct {
	ID uint64 `json:"id"`
	// Op is the operation:
	//   - "new": start servers of Kind (see newServers), N of them (members,
	//     for a cluster kind), with redis-server arguments Args;
	//   - "stop", "start", "kill", "pause", "unpause", "terminate",
	//     "checkfaketime": that method of the server Server; "shiftclock":
	//     its ShiftClock by Nanos;
	//   - "terminategroup": terminate the cluster Group;
	//   - "terminateall": terminate every server and network started so far;
	//   - "cancel": cancel the request Target (no response).
	Op       string   `json:"op"`
	Kind     string   `json:"kind,omitempty"`
	N        int      `json:"n,omitempty"`
	Args     []string `json:"args,omitempty"`
	Server   string   `json:"server,omitempty"`
	Group    string   `json:"group,omitempty"`
	Nanos    int64    `json:"nanos,omitempty"`
	Deadline int64    `json:"deadline,omitempty"`
	Target   uint64   `json:"target,omitempty"`
}

// response is one line of serverd's output.
type response struct {
	ID      uint64       `json:"id"`
	Servers []serverInfo `json:"servers,omitempty"` // "new"
	Group   string       `json:"group,omitempty"`   // "new" of a cluster kind
	CAPEM   []byte       `json:"ca_pem,omitempty"`  // "new" of kind etcd-tls or zookeeper-tls or redis-tls
	Addr    string       `json:"addr,omitempty"`    // "start": the address now
	Error   *wireError   `json:"error,omitempty"`
}

// serverInfo describes a server started by "new".
type serverInfo struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	Addr string `json:"addr"`
}

// wireError is an error as the client sees it: its message, and a code for
// the errors that tests tell apart.
type wireError struct {
	Msg string `json:"msg"`
	// Code is "missing" (something the servers need is missing: Docker,
	// an image, the Ryuk reaper; tests skip unless DLOCK_REQUIRE_SERVERS=1),
	// "nofaketime" (matches ErrNoFaketime), "needshost" (matches
	// ErrNeedsHostNetwork), or empty.
	Code string `json:"code,omitempty"`
}

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Msg: err.Error()}
	var missing *missingError
	switch {
	case errors.Is(err, ErrNoFaketime):
		w.Code = "nofaketime"
	case errors.Is(err, ErrNeedsHostNetwork):
		w.Code = "needshost"
	case errors.As(err, &missing):
		w.Code = "missing"
	}
	return w
}

// daemon holds what serverd has started, by the ids it gave out.
type daemon struct {
	outMu sync.Mutex
	out   *json.Encoder

	mu       sync.Mutex
	nextID   int
	servers  map[string]*Server
	groups   map[string]*group
	inflight map[uint64]context.CancelFunc
}

func main() {
	// Only responses go to the real standard output: anything a library
	// prints goes to standard error.
	out := os.Stdout
	os.Stdout = os.Stderr
	signal.Ignore(os.Interrupt)
	// A write to a closed pipe on fd 1 or 2 (the test process, or the go
	// command reading its output, is gone) must be an error, not death by
	// SIGPIPE before the clean-up.
	signal.Ignore(syscall.SIGPIPE)
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)

	d := &daemon{
		out:      json.NewEncoder(out),
		servers:  map[string]*Server{},
		groups:   map[string]*group{},
		inflight: map[uint64]context.CancelFunc{},
	}
	base, cancelAll := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 64*1024), 16<<20)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
		if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintln(os.Stderr, "serverd: reading requests:", err)
		}
	}()
loop:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				break loop
			}
			var req request
			if err := json.Unmarshal(line, &req); err != nil {
				fmt.Fprintf(os.Stderr, "serverd: bad request %q: %v\n", line, err)
				continue
			}
			if req.Op == "cancel" {
				d.cancel(req.Target)
				continue
			}
			ctx, cancel := context.WithCancel(base)
			if req.Deadline != 0 {
				ctx, cancel = context.WithDeadline(base, time.Unix(0, req.Deadline))
			}
			d.mu.Lock()
			d.inflight[req.ID] = cancel
			d.mu.Unlock()
			wg.Go(func() {
				resp := d.serve(ctx, req)
				d.cancel(req.ID)
				resp.ID = req.ID
				d.outMu.Lock()
				err := d.out.Encode(resp)
				d.outMu.Unlock()
				if err != nil {
					fmt.Fprintln(os.Stderr, "serverd: writing a response:", err)
				}
			})
		case <-terms:
			break loop
		}
	}
	cancelAll()
	wg.Wait()
	if err := terminateAll(); err != nil {
		fmt.Fprintln(os.Stderr, "serverd:", err)
		os.Exit(1)
	}
}

// cancel cancels the request id's context, if it is still in flight.
func (d *daemon) cancel(id uint64) {
	d.mu.Lock()
	cancel := d.inflight[id]
	delete(d.inflight, id)
	d.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// add gives s an id and returns its description.
func (d *daemon) add(s *Server) serverInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextID++
	id := "s" + strconv.Itoa(d.nextID)
	d.servers[id] = s
	return serverInfo{ID: id, Kind: s.kind.name, Addr: s.Addr()}
}

// addGroup gives g and its servers ids.
func (d *daemon) addGroup(g *group, resp *response) {
	for _, s := range g.servers {
		resp.Servers = append(resp.Servers, d.add(s))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextID++
	resp.Group = "g" + strconv.Itoa(d.nextID)
	d.groups[resp.Group] = g
}

// serve does what req asks.
func (d *daemon) serve(ctx context.Context, req request) response {
	var resp response
	fail := func(err error) response {
		return response{Error: toWire(err)}
	}
	switch req.Op {
	case "new":
		if err := d.newServers(ctx, req, &resp); err != nil {
			return fail(err)
		}
		return resp
	case "terminategroup":
		d.mu.Lock()
		g := d.groups[req.Group]
		d.mu.Unlock()
		if g == nil {
			return fail(fmt.Errorf("servers: no group %q", req.Group))
		}
		return fail(g.terminate(ctx))
	case "terminateall":
		return fail(terminateAll())
	}

	d.mu.Lock()
	s := d.servers[req.Server]
	d.mu.Unlock()
	if s == nil {
		return fail(fmt.Errorf("servers: %s: no server %q", req.Op, req.Server))
	}
	var err error
	switch req.Op {
	case "stop":
		err = s.Stop(ctx)
	case "start":
		err = s.Start(ctx)
		resp.Addr = s.Addr()
	case "kill":
		err = s.Kill(ctx)
	case "pause":
		err = s.Pause(ctx)
	case "unpause":
		err = s.Unpause(ctx)
	case "terminate":
		err = s.Terminate(ctx)
	case "shiftclock":
		err = s.ShiftClock(ctx, time.Duration(req.Nanos))
	case "checkfaketime":
		err = s.checkFaketime(ctx)
	default:
		err = fmt.Errorf("servers: unknown operation %q", req.Op)
	}
	if err != nil {
		return fail(err)
	}
	return resp
}

// newServers starts the servers a "new" request asks for. Kinds: "redis"
// (StartRedisWithArgs), "redis-faketime", "redis-tls", "redis-cluster" (one server),
// "redis-sentinel" (primary, replica, sentinel), "postgres", and the
// cluster kinds "etcd", "etcd-tls", "zookeeper", "zookeeper-tls" (one
// cluster of N).
func (d *daemon) newServers(ctx context.Context, req request, resp *response) error {
	var ss []*Server
	var err error
	switch req.Kind {
	case "redis":
		ss, err = StartRedisWithArgs(ctx, req.N, req.Args...)
	case "redis-faketime":
		ss, err = StartRedisFaketime(ctx, req.N, req.Args...)
	case "redis-tls":
		ss, resp.CAPEM, err = StartRedisTLS(ctx, req.N)
	case "redis-cluster":
		var s *Server
		if s, err = StartRedisCluster(ctx); err == nil {
			ss = []*Server{s}
		}
	case "redis-sentinel":
		var r *RedisSentinel
		if r, err = StartRedisSentinel(ctx); err == nil {
			ss = []*Server{r.Primary, r.Replica, r.Sentinel}
		}
	case "postgres":
		ss, err = start(ctx, postgresKind, req.N)
	case "etcd", "etcd-tls":
		start := StartEtcd
		if req.Kind == "etcd-tls" {
			start = StartEtcdTLS
		}
		c, err := start(ctx, req.N)
		if err != nil {
			return err
		}
		d.addGroup(c.g, resp)
		resp.CAPEM = c.CAPEM
		return nil
	case "zookeeper", "zookeeper-tls":
		start := StartZooKeeper
		if req.Kind == "zookeeper-tls" {
			start = StartZooKeeperTLS
		}
		e, err := start(ctx, req.N)
		if err != nil {
			return err
		}
		d.addGroup(e.g, resp)
		resp.CAPEM = e.CAPEM
		return nil
	default:
		return fmt.Errorf("servers: unknown kind %q", req.Kind)
	}
	if err != nil {
		return err
	}
	for _, s := range ss {
		resp.Servers = append(resp.Servers, d.add(s))
	}
	return nil
}
