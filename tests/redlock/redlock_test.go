package redlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

func TestMain(m *testing.M) { servers.Main(m) }

// testNodeTimeout is the per-node timeout of the tests' lockers, above the
// 50ms default: under -race, on a 2-core CI machine starting containers for
// other tests, a round trip to a healthy node can take longer than 50ms.
// An attempt's timeout stays capped at a tenth of its TTL.
const testNodeTimeout = 250 * time.Millisecond

// clients returns one client per address, closed when tb ends. They honour
// context deadlines on the socket, as Redlock's per-node timeouts need.
func clients(tb testing.TB, addrs []string) []goredis.UniversalClient {
	tb.Helper()
	cs := make([]goredis.UniversalClient, len(addrs))
	for i, a := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: a, ContextTimeoutEnabled: true, MaxRetries: -1})
		tb.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	return cs
}

func addrs(ss []*servers.Server) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Addr()
	}
	return out
}

func lockKey(key string) string { return redlock.DefaultPrefix + "{" + key + "}" }

func uniqueKey(tb testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(tb.Name(), "/", ".") + "." + hex.EncodeToString(b[:])
}

// harness runs the conformance suite on five Redis masters.
type harness struct {
	tb    testing.TB
	addrs []string
	admin []goredis.UniversalClient

	mu   sync.Mutex
	made [][]goredis.UniversalClient
}

func (h *harness) NewLocker(ctx context.Context, opts *dlock.Options) (*dlock.Locker, error) {
	cs := make([]goredis.UniversalClient, len(h.addrs))
	for i, a := range h.addrs {
		cs[i] = goredis.NewClient(&goredis.Options{Addr: a, ContextTimeoutEnabled: true})
	}
	h.mu.Lock()
	h.made = append(h.made, cs)
	h.mu.Unlock()
	return redlock.New(ctx, cs, &redlock.Options{Locker: opts, NodeTimeout: testNodeTimeout})
}

func (h *harness) Expire(ctx context.Context, key string) error {
	for _, c := range h.admin {
		if err := c.Del(ctx, lockKey(key)).Err(); err != nil {
			return err
		}
	}
	return nil
}

func (h *harness) Residue(ctx context.Context, key string) (bool, error) {
	for _, c := range h.admin {
		n, err := c.Exists(ctx, lockKey(key)).Result()
		if err != nil || n > 0 {
			return n > 0, err
		}
	}
	return false, nil
}

func (h *harness) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, cs := range h.made {
		for _, c := range cs {
			_ = c.Close()
		}
	}
}

func TestConformance(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return &harness{tb: t, addrs: a, admin: clients(t, a)}, nil
	})
}

func TestBadConfig(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	cs := clients(t, a)
	dupAddr := goredis.NewClient(&goredis.Options{Addr: a[0], ContextTimeoutEnabled: true})
	defer dupAddr.Close()
	noDeadlines := goredis.NewClient(&goredis.Options{Addr: a[3]})
	defer noDeadlines.Close()
	for _, bad := range [][]goredis.UniversalClient{
		nil, cs[:1], cs[:2], cs[:4],
		{cs[0], cs[0], cs[1]},       // one client twice: two votes for one server
		{cs[0], dupAddr, cs[1]},     // one server through two clients
		{cs[0], cs[1], noDeadlines}, // per-node timeouts would not cut its round trips
	} {
		if _, err := redlock.NewDriver(t.Context(), bad, nil); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%d nodes: %v, want ErrInvalidConfig", len(bad), err)
		}
	}
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": a[0]}})
	defer ring.Close()
	if _, err := redlock.NewDriver(t.Context(), []goredis.UniversalClient{cs[0], cs[1], ring}, nil); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("a Ring node: %v, want ErrInvalidConfig", err)
	}
	for _, o := range []redlock.Options{{DriftFactor: 0.5}, {DriftFactor: -1}, {NodeTimeout: -time.Second}} {
		if _, err := redlock.NewDriver(t.Context(), cs[:3], &o); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", o, err)
		}
	}
	for _, u := range []string{"redlock://", "redlock://h1,,h2", "redlock://h1,h2,h3?foo=1", "redlock://h1,h2,h3?drift_factor=2", "redlock://h1,h2,h3/x", "redlock://h1,H1:6379,h2"} {
		if _, err := dlock.Open(t.Context(), u); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("Open(%q) = %v, want ErrInvalidConfig", u, err)
		}
	}
}

func TestOpen(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	l, err := dlock.Open(t.Context(), "redlock://"+strings.Join(a[:3], ",")+"?ttl=2s&node_timeout=20ms")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	le, err := l.Acquire(t.Context(), uniqueKey(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if le.TTL() != 2*time.Second || le.Token() == 0 {
		t.Errorf("TTL %v token %d; want the URL's 2s and a token", le.TTL(), le.Token())
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestOpenForCorrectness(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	_, err := dlock.Open(t.Context(), "redlock://"+strings.Join(a[:3], ",")+"?purpose=correctness")
	if !errors.Is(err, dlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "etcd or ZooKeeper") {
		t.Fatalf("Open for correctness = %v; want ErrInvalidConfig naming etcd or ZooKeeper", err)
	}
}

// TestDeadlineUsesDriftFactor: the Locker's deadlines use Redlock's drift
// factor when it is larger than the Locker's.
func TestDeadlineUsesDriftFactor(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	l, err := dlock.Open(t.Context(), "redlock://"+strings.Join(a[:3], ",")+"?drift_factor=0.2")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const ttl = 10 * time.Second
	before := time.Now()
	le, err := l.TryAcquire(t.Context(), uniqueKey(t), &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if latest := before.Add(ttl - ttl/5); le.Deadline().After(latest) {
		t.Errorf("Deadline %v is after start + TTL − 20%% drift (%v)", le.Deadline(), latest)
	}
	_ = le.Release(t.Context())
}
