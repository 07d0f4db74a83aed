package servers_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/tests/servers"
)

func TestMain(m *testing.M) { servers.Main(m) }

func ping(ctx context.Context, addr string, timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  timeout,
		ReadTimeout:  timeout,
		WriteTimeout: timeout,
		MaxRetries:   -1,
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.Ping(ctx).Err()
}

// eventually polls f until it succeeds or a generous deadline passes.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after 30s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestSharedRedis(t *testing.T) {
	srvs := servers.Redis(t, 2)
	if len(srvs) != 2 {
		t.Fatalf("Redis(t, 2) returned %d servers", len(srvs))
	}
	if srvs[0].Addr() == srvs[1].Addr() {
		t.Fatalf("two servers share the address %s", srvs[0].Addr())
	}
	for _, s := range srvs {
		if err := ping(t.Context(), s.Addr(), 5*time.Second); err != nil {
			t.Fatalf("PING %s: %v", s, err)
		}
	}
	again := servers.Redis(t, 1)
	if again[0] != srvs[0] {
		t.Fatalf("second Redis call started new servers instead of reusing the shared set")
	}
}

func TestFaultControls(t *testing.T) {
	ctx := t.Context()
	srvs, err := servers.StartRedis(ctx, 1)
	if err != nil {
		t.Fatalf("StartRedis: %v", err)
	}
	s := srvs[0]
	t.Cleanup(func() {
		if err := s.Terminate(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("Terminate: %v", err)
		}
	})
	if err := ping(ctx, s.Addr(), 5*time.Second); err != nil {
		t.Fatalf("PING %s: %v", s, err)
	}

	t.Run("StopStart", func(t *testing.T) {
		if err := s.Stop(ctx); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if err := ping(ctx, s.Addr(), time.Second); err == nil {
			t.Fatalf("PING %s succeeded on a stopped server", s)
		}
		if err := s.Start(ctx); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := ping(ctx, s.Addr(), 5*time.Second); err != nil {
			t.Fatalf("PING %s after Start: %v", s, err)
		}
	})

	t.Run("KillStart", func(t *testing.T) {
		if err := s.Kill(ctx); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		if err := ping(ctx, s.Addr(), time.Second); err == nil {
			t.Fatalf("PING %s succeeded on a killed server", s)
		}
		if err := s.Start(ctx); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := ping(ctx, s.Addr(), 5*time.Second); err != nil {
			t.Fatalf("PING %s after Start: %v", s, err)
		}
	})

	t.Run("PauseUnpause", func(t *testing.T) {
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		if err := ping(ctx, s.Addr(), 300*time.Millisecond); err == nil {
			t.Fatalf("PING %s succeeded on a paused server", s)
		}
		if err := s.Unpause(ctx); err != nil {
			t.Fatalf("Unpause: %v", err)
		}
		eventually(t, "PING after Unpause", func() error {
			return ping(ctx, s.Addr(), 2*time.Second)
		})
	})
}

// etcdClient returns a client of the given endpoints, closed when t ends.
func etcdClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("etcd client for %v: %v", endpoints, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// etcdPut puts key=val, with a deadline.
func etcdPut(ctx context.Context, c *clientv3.Client, key, val string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.Put(ctx, key, val)
	return err
}

func TestSharedEtcd(t *testing.T) {
	c := servers.Etcd(t, 1)
	if len(c.Members) != 1 || len(c.Endpoints()) != 1 {
		t.Fatalf("Etcd(t, 1) = %v: want one member", c)
	}
	cli := etcdClient(t, c.Endpoints()...)
	start := time.Now()
	before, err := c.Members[0].CPU(t.Context())
	if err != nil {
		t.Fatalf("CPU: %v", err)
	}
	for range 100 {
		if err := etcdPut(t.Context(), cli, t.Name(), "v"); err != nil {
			t.Fatalf("Put: %v", err)
		}
	}
	// The container's CPU time grows with the work the member did, and
	// by no more than the CPUs could give it meanwhile.
	after, err := c.Members[0].CPU(t.Context())
	if most := time.Since(start) * time.Duration(runtime.NumCPU()); err != nil || after <= before || after-before > most {
		t.Fatalf("CPU after 100 puts = %v, %v: want more than before (%v), by at most %v", after, err, before, most)
	}
	if again := servers.Etcd(t, 1); again != c {
		t.Fatalf("second Etcd(t, 1) call returned another cluster instead of the shared one")
	}
}

func TestEtcdCluster(t *testing.T) {
	ctx := t.Context()
	c, err := servers.StartEtcd(ctx, 3)
	if err != nil {
		t.Fatalf("StartEtcd: %v", err)
	}
	t.Cleanup(func() {
		for range 2 { // terminating twice is harmless
			if err := c.Terminate(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("Terminate: %v", err)
			}
		}
	})
	eps := c.Endpoints()
	if len(eps) != 3 || eps[0] == eps[1] || eps[1] == eps[2] || eps[0] == eps[2] {
		t.Fatalf("Endpoints() = %v: want three distinct endpoints", eps)
	}

	cli := etcdClient(t, eps...)
	if err := etcdPut(ctx, cli, "k", "v1"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	get, err := cli.Get(ctx, "k")
	if err != nil || len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "v1" {
		t.Fatalf("Get k = %v, %v: want v1", get, err)
	}
	ml, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatalf("MemberList: %v", err)
	}
	if len(ml.Members) != 3 {
		t.Fatalf("MemberList: %d members, want 3", len(ml.Members))
	}

	victim := c.Members[2]
	st, err := cli.Status(ctx, victim.Addr())
	if err != nil {
		t.Fatalf("Status %s: %v", victim, err)
	}
	id := st.Header.MemberId

	if err := victim.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	// The survivors keep a quorum (after an election if the victim led).
	survivors := etcdClient(t, eps[:2]...)
	eventually(t, "Put with one member killed", func() error {
		return etcdPut(ctx, survivors, "k", "v2")
	})
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = cli.Status(sctx, victim.Addr())
	cancel()
	if err == nil {
		t.Fatalf("Status %s answered with the member killed", victim)
	}

	if err := victim.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	// Back with its data: the same member, catching up on what it missed.
	back := etcdClient(t, victim.Addr())
	eventually(t, "the restarted member serving the write it missed", func() error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		st, err := back.Status(ctx, victim.Addr())
		if err != nil {
			return err
		}
		if st.Header.MemberId != id {
			return fmt.Errorf("member ID %x, want %x (the member before Kill)", st.Header.MemberId, id)
		}
		get, err := back.Get(ctx, "k", clientv3.WithSerializable())
		if err != nil {
			return err
		}
		if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "v2" {
			return fmt.Errorf("local read of k = %v, want v2", get.Kvs)
		}
		return nil
	})
}

// quiet is a zk.Logger that drops the client's messages (reconnects to
// killed servers are expected here).
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// zkConnect returns a ZooKeeper client of the given servers, closed when t
// ends.
func zkConnect(t *testing.T, addrs ...string) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect(addrs, 4*time.Second, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatalf("zk.Connect %v: %v", addrs, err)
	}
	t.Cleanup(c.Close)
	return c
}

// zkGet reads path and checks that it holds want.
func zkGet(c *zk.Conn, path, want string) error {
	got, _, err := c.Get(path)
	if err != nil {
		return fmt.Errorf("Get %s: %w", path, err)
	}
	if string(got) != want {
		return fmt.Errorf("Get %s = %q, want %q", path, got, want)
	}
	return nil
}

// zkCreate creates path holding data; a node already there (created by an
// earlier attempt whose answer was lost) counts as created.
func zkCreate(c *zk.Conn, path, data string) error {
	_, err := c.Create(path, []byte(data), zk.FlagPersistent, zk.WorldACL(zk.PermAll))
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("Create %s: %w", path, err)
	}
	return nil
}

// fourLetterWord sends a ZooKeeper four-letter word (ruok, srvr, ...) to
// addr and returns the answer.
func fourLetterWord(addr, word string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(conn, word); err != nil {
		return "", err
	}
	b, err := io.ReadAll(conn)
	return string(b), err
}

// zkServing checks with srvr that the server at addr serves clients, in one
// of the modes given.
func zkServing(addr string, modes ...string) error {
	out, err := fourLetterWord(addr, "srvr")
	if err != nil {
		return fmt.Errorf("srvr %s: %w", addr, err)
	}
	for _, m := range modes {
		if strings.Contains(out, "\nMode: "+m+"\n") {
			return nil
		}
	}
	return fmt.Errorf("srvr %s: want mode %v, got %q", addr, modes, out)
}

func TestSharedZooKeeper(t *testing.T) {
	e := servers.ZooKeeper(t, 1)
	if len(e.Members) != 1 || len(e.Servers()) != 1 {
		t.Fatalf("ZooKeeper(t, 1) = %v: want one server", e)
	}
	if err := zkServing(e.Servers()[0], "standalone"); err != nil {
		t.Fatal(err)
	}
	c := zkConnect(t, e.Servers()...)
	// A container node (as the lock backend's parents are) and a child;
	// unique per run, as the server is shared (and reused by -count).
	dir := fmt.Sprintf("/%s-%d", t.Name(), time.Now().UnixNano())
	if _, err := c.CreateContainer(dir, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("CreateContainer %s: %v", dir, err)
	}
	if err := zkCreate(c, dir+"/n", "v"); err != nil {
		t.Fatal(err)
	}
	if err := zkGet(c, dir+"/n", "v"); err != nil {
		t.Fatal(err)
	}
	if again := servers.ZooKeeper(t, 1); again != e {
		t.Fatalf("second ZooKeeper(t, 1) call returned another ensemble instead of the shared one")
	}
}

func TestZooKeeperEnsemble(t *testing.T) {
	ctx := t.Context()
	e, err := servers.StartZooKeeper(ctx, 3)
	if err != nil {
		t.Fatalf("StartZooKeeper: %v", err)
	}
	t.Cleanup(func() {
		for range 2 { // terminating twice is harmless
			if err := e.Terminate(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("Terminate: %v", err)
			}
		}
	})
	addrs := e.Servers()
	if len(addrs) != 3 || addrs[0] == addrs[1] || addrs[1] == addrs[2] || addrs[0] == addrs[2] {
		t.Fatalf("Servers() = %v: want three distinct addresses", addrs)
	}
	// Ready means serving: every member is leader or follower at once.
	leader := -1
	for i, a := range addrs {
		if err := zkServing(a, "leader", "follower"); err != nil {
			t.Fatal(err)
		}
		if zkServing(a, "leader") == nil {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("no member of %v is the leader", e)
	}

	c := zkConnect(t, addrs...)
	if err := zkCreate(c, "/k", "v1"); err != nil {
		t.Fatal(err)
	}

	// Kill the leader: the two others elect a new one and keep serving.
	victim := e.Members[leader]
	if err := victim.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if out, err := fourLetterWord(victim.Addr(), "ruok"); err == nil && out == "imok" {
		t.Fatalf("ruok %s answered imok with the server killed", victim)
	}
	var rest []string
	var survivor *servers.Server
	for i, s := range e.Members {
		if i != leader {
			rest = append(rest, s.Addr())
			survivor = s
		}
	}
	survivors := zkConnect(t, rest...)
	eventually(t, "read and create with the leader killed", func() error {
		if err := zkGet(survivors, "/k", "v1"); err != nil {
			return err
		}
		return zkCreate(survivors, "/k2", "v2")
	})

	// Back with its data, serving (as a follower now) when Start returns,
	// and caught up on what it missed.
	if err := victim.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if out, err := fourLetterWord(victim.Addr(), "ruok"); err != nil || out != "imok" {
		t.Fatalf("ruok %s after Start = %q, %v: want imok", victim, out, err)
	}
	if err := zkServing(victim.Addr(), "leader", "follower"); err != nil {
		t.Fatalf("after Start: %v", err)
	}
	back := zkConnect(t, victim.Addr())
	eventually(t, "the restarted server serving what it missed", func() error {
		return zkGet(back, "/k2", "v2")
	})

	// A survivor has logged its readiness twice by now (it went through an
	// election after the kill): Start after Stop still waits for the new
	// start to serve.
	if err := survivor.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := survivor.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := zkServing(survivor.Addr(), "leader", "follower"); err != nil {
		t.Fatalf("after Stop and Start: %v", err)
	}
}

// pgStartup connects to the PostgreSQL server of the connection URL u,
// checks the session (see pgSession), and disconnects.
func pgStartup(u string) error {
	conn, err := pgSession(u)
	if err != nil {
		return err
	}
	_, _ = conn.Write([]byte{'X', 0, 0, 0, 4}) // Terminate
	return conn.Close()
}

// pgSession connects to the PostgreSQL server of the connection URL u and
// runs the protocol's startup (version 3.0, no TLS) as u's user on u's
// database: it checks that the server lets the user in without a password
// (AuthenticationOk) and becomes ready for queries, and returns the
// connection, idle in the session.
func pgSession(u string) (conn net.Conn, err error) {
	pu, err := url.Parse(u)
	if err != nil {
		return nil, err
	}
	conn, err = net.DialTimeout("tcp", pu.Host, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = conn.Close()
		}
	}()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))

	body := binary.BigEndian.AppendUint32(nil, 3<<16) // protocol 3.0
	for _, kv := range [][2]string{{"user", pu.User.Username()}, {"database", pu.Path[1:]}} {
		body = append(append(append(append(body, kv[0]...), 0), kv[1]...), 0)
	}
	body = append(body, 0)
	msg := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)))
	if _, err := conn.Write(append(msg, body...)); err != nil {
		return nil, err
	}

	r := bufio.NewReader(conn)
	authOK := false
	for {
		var hdr [5]byte // type, length (including itself)
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, fmt.Errorf("read a message: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n < 4 || n > 1<<16 {
			return nil, fmt.Errorf("message %q: bad length %d", hdr[0], n)
		}
		payload := make([]byte, n-4)
		if _, err := io.ReadFull(r, payload); err != nil {
			return nil, fmt.Errorf("read message %q: %w", hdr[0], err)
		}
		switch hdr[0] {
		case 'R': // Authentication*: 0 is AuthenticationOk
			if len(payload) < 4 || binary.BigEndian.Uint32(payload) != 0 {
				return nil, fmt.Errorf("the server asks for authentication (%x)", payload)
			}
			authOK = true
		case 'E':
			return nil, fmt.Errorf("error response: %q", payload)
		case 'Z': // ReadyForQuery
			if !authOK {
				return nil, errors.New("ReadyForQuery before AuthenticationOk")
			}
			_ = conn.SetDeadline(time.Time{})
			return conn, nil
		}
	}
}

func TestSharedPostgres(t *testing.T) {
	s := servers.Postgres(t)
	u := servers.PostgresURL(s)
	if want := "postgres://postgres@" + s.Addr() + "/postgres?sslmode=disable"; u != want {
		t.Fatalf("PostgresURL = %q, want %q", u, want)
	}
	if err := pgStartup(u); err != nil {
		t.Fatalf("startup %s: %v", u, err)
	}
	if again := servers.Postgres(t); again != s {
		t.Fatalf("second Postgres call started a new server instead of reusing the shared one")
	}
}

func TestPostgresKillStart(t *testing.T) {
	ctx := t.Context()
	s, err := servers.StartPostgres(ctx)
	if err != nil {
		t.Fatalf("StartPostgres: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Terminate(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("Terminate: %v", err)
		}
	})
	if err := pgStartup(servers.PostgresURL(s)); err != nil {
		t.Fatalf("startup: %v", err)
	}
	// Killed, the server leaves its postmaster.pid behind; it comes back
	// (crash recovery on the kept data directory) all the same.
	if err := s.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := pgStartup(servers.PostgresURL(s)); err == nil {
		t.Fatalf("startup succeeded on a killed server")
	}
	if err := s.Start(ctx); err != nil {
		t.Fatalf("Start after Kill: %v", err)
	}
	if err := pgStartup(servers.PostgresURL(s)); err != nil {
		t.Fatalf("startup after Kill and Start: %v", err)
	}
	// Stop is a fast shutdown: quick even with a session open (a smart
	// shutdown would wait for it to end).
	conn, err := pgSession(servers.PostgresURL(s))
	if err != nil {
		t.Fatalf("startup: %v", err)
	}
	defer conn.Close()
	begin := time.Now()
	if err := s.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("Stop took %v", d)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatalf("Start after Stop: %v", err)
	}
	if err := pgStartup(servers.PostgresURL(s)); err != nil {
		t.Fatalf("startup after Stop and Start: %v", err)
	}
}

// The ports chosen for servers on the host network lie below the kernel's
// ephemeral range, where no outgoing connection takes them while a server
// is stopped, and are never handed out twice.
func TestFreePortOutsideEphemeralRange(t *testing.T) {
	lo, hi := servers.StaticPorts()
	if lo < 1024 || hi > 65536 || hi-lo < 1000 {
		t.Fatalf("StaticPorts() = %d, %d: want a range of at least 1000 ports above 1023", lo, hi)
	}
	seen := map[int]bool{}
	for range 50 {
		p, err := servers.FreePort()
		if err != nil {
			t.Fatalf("FreePort: %v", err)
		}
		if p < lo || p >= hi || seen[p] {
			t.Fatalf("FreePort() = %d: want a port in [%d, %d) not handed out before", p, lo, hi)
		}
		seen[p] = true
	}
}
