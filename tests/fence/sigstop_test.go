package fence_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/tests/servers"
)

// childEnv, when set, makes the test binary TestPausedProcess's child.
const childEnv = "DLOCK_FENCE_CHILD"

// stores names the fenced stores for a child process.
type stores struct {
	Redis, Etcd, Postgres, Table string
}

func (s stores) env() []string {
	return []string{"DLOCK_FENCE_REDIS=" + s.Redis, "DLOCK_FENCE_ETCD=" + s.Etcd, "DLOCK_FENCE_PG=" + s.Postgres, "DLOCK_FENCE_TABLE=" + s.Table}
}

func storesFromEnv() stores {
	return stores{os.Getenv("DLOCK_FENCE_REDIS"), os.Getenv("DLOCK_FENCE_ETCD"), os.Getenv("DLOCK_FENCE_PG"), os.Getenv("DLOCK_FENCE_TABLE")}
}

// writeAll writes v with tok through the guard of every store and returns
// one result per store: "ok", "stale", or the error.
func (s stores) writeAll(ctx context.Context, key, v string, tok dlock.Token) (map[string]string, error) {
	rc := goredis.NewClient(&goredis.Options{Addr: s.Redis})
	defer rc.Close()
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	defer ec.Close()
	db, err := sql.Open("pgx", s.Postgres)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	out := map[string]string{}
	for name, err := range map[string]error{
		"redis": redis.FenceStore{Client: rc}.Set(ctx, key, v, tok),
		"etcd":  etcd.FenceStore{Client: ec}.Set(ctx, key, v, tok),
		"sql":   fence.SQLTable{DB: db, Table: s.Table, KeyColumn: "id", ValueColumn: "body"}.Set(ctx, key, v, tok),
	} {
		switch {
		case err == nil:
			out[name] = "ok"
		case errors.Is(err, fence.ErrStaleToken):
			out[name] = "stale"
		default:
			out[name] = err.Error()
		}
	}
	return out, nil
}

// pausedChild is the process that TestPausedProcess stops: it takes the
// lock (auto-refreshed), prints its token, waits for a line on stdin, then
// writes through every guard with that token and prints the results.
func pausedChild() int {
	ctx := context.Background()
	fail := func(err error) int { fmt.Println("error", err); return 1 }
	l, err := dlock.Open(ctx, os.Getenv(childEnv))
	if err != nil {
		return fail(err)
	}
	defer l.Close()
	key := os.Getenv("DLOCK_FENCE_KEY")
	le, err := l.Acquire(ctx, key, &dlock.AcquireOptions{AutoRefresh: true, MaxHold: time.Hour})
	if err != nil {
		return fail(err)
	}
	fmt.Println("token", le.Token())
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fail(err)
	}
	res, err := storesFromEnv().writeAll(ctx, "data/"+key, "client 1", le.Token())
	if err != nil {
		return fail(err)
	}
	for _, name := range []string{"redis", "etcd", "sql"} {
		fmt.Println(name, res[name])
	}
	return 0
}

// TestPausedProcess is Kleppmann's scenario with a real process pause: a
// child process takes the lock with automatic refresh; the test stops it
// with SIGSTOP (its watchdog stops too, as in a long GC pause) until its
// lease has run out at the server; client 2 takes the lock with a larger
// token and writes; the child is resumed and writes with its old token:
// every guard rejects it.
func TestPausedProcess(t *testing.T) {
	st := stores{
		Redis:    servers.Redis(t, 1)[0].Addr(),
		Etcd:     servers.Etcd(t, 1).Endpoints()[0],
		Postgres: servers.PostgresURL(servers.Postgres(t)),
		Table:    fmt.Sprintf("paused_%d", time.Now().UnixNano()),
	}
	db, err := sql.Open("pgx", st.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE `+st.Table+` (id text PRIMARY KEY, body text, fence_token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// Short leases, so that the pause outlasts them.
	lockURLs := map[string]string{
		"redis":     "redis://" + servers.Redis(t, 1)[0].Addr() + "?ttl=1s",
		"etcd":      "etcd://" + servers.Etcd(t, 1).Endpoints()[0] + "?ttl=2s",
		"zookeeper": "zk://" + servers.ZooKeeper(t, 1).Servers()[0] + "?ttl=1s&session_timeout=2s&tick_time=200ms", // TTL bound 2s - 2s/3 - 200ms
		"redlock":   "redlock://" + redlockNodes(t) + "?ttl=1s&node_timeout=250ms",
	}
	for backend, u := range lockURLs {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			key := fmt.Sprintf("paused/%s/%d", backend, time.Now().UnixNano())
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), append(st.env(), childEnv+"="+u, "DLOCK_FENCE_KEY="+key)...)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			lines := bufio.NewScanner(stdout)
			next := func() string {
				if !lines.Scan() {
					t.Fatalf("child: no more output (%v)", lines.Err())
				}
				return lines.Text()
			}
			first := next()
			t1, err := strconv.ParseUint(strings.TrimPrefix(first, "token "), 10, 64)
			if err != nil {
				t.Fatalf("child: %q", first)
			}

			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			c2, err := dlock.Open(t.Context(), u)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			l2, err := c2.Acquire(ctx, key, nil) // waits out the stopped child's lease
			cancel()
			if err != nil {
				t.Fatalf("client 2: %v", err)
			}
			if uint64(l2.Token()) <= t1 {
				t.Fatalf("client 2's token %d not above the stopped child's %d", l2.Token(), t1)
			}
			res, err := st.writeAll(t.Context(), "data/"+key, "client 2", l2.Token())
			if err != nil {
				t.Fatal(err)
			}
			for name, r := range res {
				if r != "ok" {
					t.Fatalf("client 2's write to %s: %s", name, r)
				}
			}

			if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if _, err := fmt.Fprintln(stdin, "write"); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				name, result, _ := strings.Cut(next(), " ")
				if result != "stale" {
					t.Errorf("%s: the resumed child's write with token %d: %s, want rejected as stale", name, t1, result)
				}
			}
			_ = l2.Release(t.Context())
		})
	}
}
