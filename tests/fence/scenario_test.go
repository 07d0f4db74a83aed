package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/fence"
	_ "github.com/dlock-go/dlock/memory"
	"github.com/dlock-go/dlock/redis"
	_ "github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
	_ "github.com/dlock-go/dlock/zookeeper"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(pausedChild()) // TestPausedProcess's child: no tests, no servers
	}
	servers.Main(m)
}

// resources are the fenced stores of the scenario, each with a plain
// (unfenced) write for the control run.
type resource struct {
	name  string
	write func(ctx context.Context, key, v string, tok dlock.Token) error
	plain func(ctx context.Context, key, v string) error
	read  func(ctx context.Context, key string) string
}

func resources(t *testing.T) []resource {
	rc := goredis.NewClient(&goredis.Options{Addr: servers.Redis(t, 1)[0].Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	ec, err := clientv3.New(clientv3.Config{Endpoints: servers.Etcd(t, 1).Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.Close() })
	db, err := sql.Open("pgx", servers.PostgresURL(servers.Postgres(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	table := fmt.Sprintf("fenced_%d", time.Now().UnixNano())
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE `+table+` (id text PRIMARY KEY, body text, fence_token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	st := fence.SQLTable{DB: db, Table: table, KeyColumn: "id", ValueColumn: "body"}
	var (
		g   fence.Guard
		mu  sync.Mutex // the map is shared by the parallel subtests
		mem = map[string]string{}
	)
	set := func(k, v string) error {
		mu.Lock()
		defer mu.Unlock()
		mem[k] = v
		return nil
	}
	// A service behind fence.Middleware, keeping the last body per path.
	var (
		hg   fence.Guard
		hmu  sync.Mutex
		hmem = map[string]string{}
	)
	srv := httptest.NewServer(fence.Middleware(&hg, func(r *http.Request) string { return r.URL.Path }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		hmu.Lock()
		hmem[r.URL.EscapedPath()] = string(body)
		hmu.Unlock()
	})))
	t.Cleanup(srv.Close)
	httpPut := func(ctx context.Context, k, v string, tok dlock.Token) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+"/"+url.PathEscape(k), strings.NewReader(v))
		if err != nil {
			return err
		}
		if tok != 0 {
			fence.SetHeader(req.Header, tok)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return nil
		case http.StatusConflict:
			return fmt.Errorf("HTTP 409: %w", fence.ErrStaleToken)
		}
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return []resource{
		{
			name:  "http",
			write: httpPut,
			plain: func(_ context.Context, k, v string) error {
				hmu.Lock()
				defer hmu.Unlock()
				hmem["/"+url.PathEscape(k)] = v
				return nil
			},
			read: func(_ context.Context, k string) string {
				hmu.Lock()
				defer hmu.Unlock()
				return hmem["/"+url.PathEscape(k)]
			},
		},
		{
			name: "memory",
			write: func(_ context.Context, k, v string, tok dlock.Token) error {
				return g.Do(k, tok, func() error { return set(k, v) })
			},
			plain: func(_ context.Context, k, v string) error { return set(k, v) },
			read: func(_ context.Context, k string) string {
				mu.Lock()
				defer mu.Unlock()
				return mem[k]
			},
		},
		{
			name: "sql",
			write: func(ctx context.Context, k, v string, tok dlock.Token) error {
				return st.Set(ctx, k, v, tok)
			},
			plain: func(ctx context.Context, k, v string) error {
				_, err := db.ExecContext(ctx, `INSERT INTO `+table+` (id, body, fence_token) VALUES ($1, $2, 0)
ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body`, k, v)
				return err
			},
			read: func(ctx context.Context, k string) string {
				var v string
				_ = db.QueryRowContext(ctx, `SELECT body FROM `+table+` WHERE id = $1`, k).Scan(&v)
				return v
			},
		},
		{
			name: "redis",
			write: func(ctx context.Context, k, v string, tok dlock.Token) error {
				return redis.FenceStore{Client: rc}.Set(ctx, k, v, tok)
			},
			plain: func(ctx context.Context, k, v string) error { return rc.Set(ctx, k, v, 0).Err() },
			read:  func(ctx context.Context, k string) string { return rc.Get(ctx, k).Val() },
		},
		{
			name: "etcd",
			write: func(ctx context.Context, k, v string, tok dlock.Token) error {
				return etcd.FenceStore{Client: ec}.Set(ctx, k, v, tok)
			},
			plain: func(ctx context.Context, k, v string) error { _, err := ec.Put(ctx, k, v); return err },
			read: func(ctx context.Context, k string) string {
				r, err := ec.Get(ctx, k)
				if err != nil || len(r.Kvs) == 0 {
					return ""
				}
				return string(r.Kvs[0].Value)
			},
		},
	}
}

// TestPauseScenario is Kleppmann's scenario with the public API, on every
// backend that issues tokens: client 1 takes the lock (token t1) and pauses
// past its TTL without refreshing; client 2 takes it (t2 > t1) and writes;
// client 1 wakes and writes with t1. Every fenced store rejects the late
// write. The control run makes the same two writes without the guard and
// asserts that client 2's update is lost: the lock alone, whose lease
// client 1 no longer holds, does not stop the late write (this shows the
// hazard; it cannot fail unless the store itself misbehaves).
func TestPauseScenario(t *testing.T) {
	res := resources(t)
	lockURLs := map[string]string{
		"memory":    "mem://fence-scenario",
		"redis":     "redis://" + servers.Redis(t, 1)[0].Addr(),
		"etcd":      "etcd://" + servers.Etcd(t, 1).Endpoints()[0],
		"zookeeper": "zk://" + servers.ZooKeeper(t, 1).Servers()[0],
		"redlock":   "redlock://" + redlockNodes(t) + "?node_timeout=250ms",
	}
	for backend, u := range lockURLs {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			c1, err := dlock.Open(t.Context(), u)
			if err != nil {
				t.Fatal(err)
			}
			defer c1.Close()
			c2, err := dlock.Open(t.Context(), u)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			ttl := max(500*time.Millisecond, c1.Limits().MinTTL)
			for _, r := range res {
				for _, fenced := range []bool{true, false} {
					key := fmt.Sprintf("fence-scenario/%s/%s/%v/%d", backend, r.name, fenced, time.Now().UnixNano())
					l1, err := c1.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
					if err != nil {
						t.Fatal(err)
					}
					// Client 1 pauses; its lease runs out meanwhile.
					ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
					l2, err := c2.Acquire(ctx, key, &dlock.AcquireOptions{TTL: 20 * time.Second})
					cancel()
					if err != nil {
						t.Fatalf("client 2: %v", err)
					}
					if l2.Token() <= l1.Token() {
						t.Fatalf("client 2's token %d not above client 1's %d", l2.Token(), l1.Token())
					}
					data := "data/" + key
					if fenced {
						if err := r.write(t.Context(), data, "client 2", l2.Token()); err != nil {
							t.Fatalf("%s: client 2's write: %v", r.name, err)
						}
						err := r.write(t.Context(), data, "client 1", l1.Token())
						if !errors.Is(err, fence.ErrStaleToken) {
							t.Errorf("%s: client 1's late write with token %d = %v, want ErrStaleToken", r.name, l1.Token(), err)
						}
						if got := r.read(t.Context(), data); got != "client 2" {
							t.Errorf("%s: store holds %q, want client 2's write", r.name, got)
						}
					} else {
						_ = r.plain(t.Context(), data, "client 2")
						_ = r.plain(t.Context(), data, "client 1")
						if got := r.read(t.Context(), data); got != "client 1" {
							t.Errorf("%s unfenced: store holds %q; the lost update did not happen", r.name, got)
						}
					}
					_ = l2.Release(t.Context())
					if err := l1.Release(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
						t.Errorf("client 1's Release after its lease ran out = %v, want ErrNotHeld", err)
					}
				}
			}
		})
	}
}

// TestConcurrentWriters: many goroutines write random tokens through each
// store's guard; the value left is the one written with the highest
// accepted token, and every rejection was a lower token.
func TestConcurrentWriters(t *testing.T) {
	for _, r := range resources(t) {
		t.Run(r.name, func(t *testing.T) {
			key := fmt.Sprintf("fence-concurrent/%s/%d", r.name, time.Now().UnixNano())
			var (
				mu      sync.Mutex
				highest dlock.Token
			)
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for range 25 {
						tok := dlock.Token(rand.N(500) + 1)
						err := r.write(t.Context(), key, fmt.Sprint(tok), tok)
						var stale *fence.StaleError
						switch {
						case err == nil:
							mu.Lock()
							highest = max(highest, tok)
							mu.Unlock()
						case errors.As(err, &stale):
							if stale.Highest <= tok {
								t.Errorf("token %d rejected, but the highest seen was %d", tok, stale.Highest)
							}
						case errors.Is(err, fence.ErrStaleToken): // over HTTP: 409, no detail
						default:
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			if got := r.read(t.Context(), key); got != fmt.Sprint(highest) {
				t.Errorf("the store holds the write of token %s, want the highest accepted, %d", got, highest)
			}
		})
	}
}

// redlockNodes lists three of the package's shared Redis servers, as the
// nodes of a Redlock URL. The tests' URLs raise node_timeout above its 50ms
// default: under -race, on a loaded CI machine, a healthy node can take
// longer to answer.
func redlockNodes(t *testing.T) string {
	var addrs []string
	for _, s := range servers.Redis(t, 3) {
		addrs = append(addrs, s.Addr())
	}
	return strings.Join(addrs, ",")
}

// TestStoreOrder: a fixed sequence through every store: equal tokens pass,
// a higher one passes (across a change in the number of digits), a lower
// one is rejected and changes nothing. Then tokens beyond 2^53, where a
// float64 (a Lua number, a JSON number, a SQL float cast) no longer tells
// neighbours apart: 2^53+1 after 2^53 passes, and 2^53 after 2^53+1 is
// rejected; a store that compared numbers instead of the exact decimal
// strings (or integers) would take it.
func TestStoreOrder(t *testing.T) {
	type step struct {
		tok   dlock.Token
		stale bool
	}
	const big = 1 << 53
	for _, r := range resources(t) {
		for _, seq := range []struct {
			name  string
			steps []step
			want  int // the step whose write the store must hold at the end
		}{
			{"small", []step{{9, false}, {9, false}, {10, false}, {9, true}, {100, false}, {99, true}}, 4},
			{"beyond 2^53", []step{{big, false}, {big + 1, false}, {big, true}}, 1},
			{"2^53 after 2^53+1", []step{{big + 1, false}, {big, true}}, 0},
		} {
			key := fmt.Sprintf("fence-order/%s/%d", r.name, time.Now().UnixNano())
			for i, st := range seq.steps {
				err := r.write(t.Context(), key, fmt.Sprint(st.tok, "#", i), st.tok)
				if got := errors.Is(err, fence.ErrStaleToken); got != st.stale || (err != nil && !got) {
					t.Errorf("%s, %s: write %d with token %d: %v; want stale=%v", r.name, seq.name, i, st.tok, err, st.stale)
				}
			}
			w := seq.steps[seq.want]
			if got, want := r.read(t.Context(), key), fmt.Sprint(w.tok, "#", seq.want); got != want {
				t.Errorf("%s, %s: store holds %q, want %q (the write with token %d)", r.name, seq.name, got, want, w.tok)
			}
		}
	}
}
