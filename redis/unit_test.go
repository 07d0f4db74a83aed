package redis_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redis"
)

// unreachable is an address where nothing listens: tests using it prove
// that an error comes before any I/O (or they would fail with a network
// error instead).
const unreachable = "127.0.0.1:1"

func TestParseURL(t *testing.T) {
	good := []struct {
		url    string
		check  func(*goredis.Options, *redis.Options) bool
		detail string
	}{
		{"redis://localhost:6380", func(c *goredis.Options, o *redis.Options) bool {
			return c.Addr == "localhost:6380" && c.TLSConfig == nil && *o == redis.Options{}
		}, "defaults"},
		{"rediss://user:pw@example.com/3", func(c *goredis.Options, o *redis.Options) bool {
			return c.Addr == "example.com:6379" && c.TLSConfig != nil && c.Username == "user" && c.Password == "pw" && c.DB == 3
		}, "TLS, ACL user, db"},
		{"redis://h:1?prefix=app:&wait_replicas=2&wait_timeout=250ms&eviction_check=warn", func(c *goredis.Options, o *redis.Options) bool {
			return o.Prefix == "app:" && o.WaitReplicas == 2 && o.WaitTimeout == 250*time.Millisecond && o.EvictionCheck == redis.EvictionWarn
		}, "backend parameters"},
		{"redis://h:1?eviction_check=ignore&dial_timeout=2s&pool_size=7", func(c *goredis.Options, o *redis.Options) bool {
			return o.EvictionCheck == redis.EvictionIgnore && c.DialTimeout == 2*time.Second && c.PoolSize == 7
		}, "go-redis client parameters pass through"},
		{"redis://h:1?fence_retention=90m", func(c *goredis.Options, o *redis.Options) bool {
			return o.FenceRetention == 90*time.Minute
		}, "fence_retention"},
		{"redis://h:1?fence_retention=never", func(c *goredis.Options, o *redis.Options) bool {
			return o.FenceRetention < 0
		}, "fence_retention=never"},
	}
	for _, tc := range good {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		c, o, err := redis.ParseURL(u)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if !tc.check(c, o) {
			t.Errorf("%s (%s): got client %+v, options %+v", tc.url, tc.detail, c, o)
		}
	}

	bad := []string{
		"redis://h:1?bogus=1",
		"redis://h:1?prefix=a{b",
		"redis://h:1?prefix=",
		"redis://h:1?prefix=a:&prefix=b:",
		"redis://h:1?wait_replicas=-1",
		"redis://h:1?wait_replicas=two",
		"redis://h:1?wait_replicas=1&wait_timeout=0s",
		"redis://h:1?wait_timeout=soon",
		"redis://h:1?eviction_check=maybe",
		"redis://h:1?fence_retention=0s",
		"redis://h:1?fence_retention=-1h",
		"redis://h:1?fence_retention=forever",
		"redis://h:1?dial_timeout=never",
		"redis://h:1/notadb",
	}
	for _, raw := range bad {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := redis.ParseURL(u); err != nil && !errors.Is(err, backend.ErrInvalidConfig) {
			t.Errorf("%s: error %v does not match ErrInvalidConfig", raw, err)
		}
		// Through dlock.Open against an address where nothing listens: the
		// error must be a configuration error, so it came before any I/O.
		_, err = dlock.Open(t.Context(), strings.Replace(raw, "h:1", unreachable, 1))
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("dlock.Open(%s) = %v, want ErrInvalidConfig", raw, err)
		}
	}
}

func TestOpenUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := dlock.Open(ctx, "redis://"+unreachable+"?dial_timeout=200ms")
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Open of an unreachable server = %v, want ErrUnavailable", err)
	}
}

func TestValidateKey(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: unreachable})
	defer client.Close()
	d, err := redis.NewDriverNoIO(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"}x", "}"} {
		if err := d.ValidateKey(k); !errors.Is(err, backend.ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", k, err)
		}
	}
	for _, k := range []string{"x", "x}", "a{b}c", "{x}", "orders/42"} {
		if err := d.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", k, err)
		}
	}

	// Through a Locker: rejected before any I/O.
	l, err := driver.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.TryAcquire(t.Context(), "}x", nil); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf("Locker.TryAcquire(\"}x\") = %v, want ErrInvalidKey", err)
	}
	// The error names the key once (the Locker's OpError), not in the
	// backend's message as well.
	long := "}" + strings.Repeat("a", dlock.MaxKeyLen-1)
	if _, err := l.TryAcquire(t.Context(), long, nil); !errors.Is(err, dlock.ErrInvalidKey) || strings.Count(err.Error(), long) != 1 {
		t.Errorf("Locker.TryAcquire of a %d-byte key beginning with '}' = %v, want ErrInvalidKey naming the key once", len(long), err)
	}
}

func TestOptionsValidation(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: unreachable})
	defer client.Close()
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{unreachable}})
	defer cluster.Close()
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": unreachable}})
	defer ring.Close()
	shortRead := goredis.NewClient(&goredis.Options{Addr: unreachable, ReadTimeout: 500 * time.Millisecond})
	defer shortRead.Close()
	for _, tc := range []struct {
		name   string
		client goredis.UniversalClient
		opts   *redis.Options
	}{
		{"prefix with {", client, &redis.Options{Prefix: "app{"}},
		{"prefix with }", client, &redis.Options{Prefix: "app}:"}},
		{"negative WaitReplicas", client, &redis.Options{WaitReplicas: -1}},
		{"negative WaitTimeout", client, &redis.Options{WaitReplicas: 1, WaitTimeout: -time.Second}},
		{"sub-ms WaitTimeout", client, &redis.Options{WaitReplicas: 1, WaitTimeout: time.Microsecond}},
		{"WaitReplicas on a cluster", cluster, &redis.Options{WaitReplicas: 1}},
		{"unknown EvictionCheck", client, &redis.Options{EvictionCheck: 7}},
		{"WaitTimeout above ReadTimeout", shortRead, &redis.Options{WaitReplicas: 1, WaitTimeout: time.Second}},
		{"WaitTimeout equal to ReadTimeout", shortRead, &redis.Options{WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond}},
		{"default WaitTimeout above ReadTimeout", shortRead, &redis.Options{WaitReplicas: 1}},
		{"nil client", nil, nil},
		{"a Ring", ring, nil},
	} {
		_, err := redis.NewDriver(t.Context(), tc.client, tc.opts)
		if !errors.Is(err, backend.ErrInvalidConfig) {
			t.Errorf("%s: NewDriver = %v, want ErrInvalidConfig", tc.name, err)
		}
	}
	// The same through a URL, and a WaitTimeout below the ReadTimeout is
	// fine (no error before the I/O).
	if _, err := dlock.Open(t.Context(), "redis://"+unreachable+"?wait_replicas=1&wait_timeout=2s&read_timeout=1s"); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("Open with wait_timeout above read_timeout = %v, want ErrInvalidConfig", err)
	}
	if _, err := redis.NewDriverNoIO(shortRead, &redis.Options{WaitReplicas: 1, WaitTimeout: 400 * time.Millisecond}); err != nil {
		t.Errorf("NewDriver with WaitTimeout below ReadTimeout = %v", err)
	}
}

// With WaitReplicas, a TTL that WAIT could outlast is refused before any I/O.
func TestWaitTimeoutBoundsTTL(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: unreachable})
	defer client.Close()
	d, err := redis.NewDriverNoIO(client, &redis.Options{WaitReplicas: 1, WaitTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.TryAcquire(t.Context(), backend.Request{Key: "k", TTL: time.Second}); !errors.Is(err, backend.ErrInvalidTTL) {
		t.Errorf("TryAcquire with TTL = WaitTimeout: %v, want ErrInvalidTTL", err)
	}
}

// TestWaitTimeoutBoundsLockerTTL: a Locker TTL that WAIT could outlast is
// refused by New before any I/O (the client's address refuses
// connections), with an error that matches ErrInvalidConfig and
// ErrInvalidTTL and names both settings; a longer one is not.
func TestWaitTimeoutBoundsLockerTTL(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: unreachable})
	defer client.Close()
	for _, ttl := range []time.Duration{500 * time.Millisecond, time.Second} {
		_, err := redis.New(t.Context(), client, &redis.Options{WaitReplicas: 1, WaitTimeout: time.Second, Locker: &dlock.Options{TTL: ttl}})
		if !errors.Is(err, dlock.ErrInvalidConfig) || !errors.Is(err, dlock.ErrInvalidTTL) || errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("New with Locker TTL %v and WaitTimeout 1s = %v, want ErrInvalidConfig and ErrInvalidTTL before any I/O", ttl, err)
		} else if !strings.Contains(err.Error(), "TTL") || !strings.Contains(err.Error(), "WaitTimeout") {
			t.Errorf("New with Locker TTL %v and WaitTimeout 1s = %v, want it to name TTL and WaitTimeout", ttl, err)
		}
	}
	if _, err := redis.NewDriverNoIO(client, &redis.Options{WaitReplicas: 1, WaitTimeout: time.Second, Locker: &dlock.Options{TTL: 1001 * time.Millisecond}}); err != nil {
		t.Errorf("NewDriver with Locker TTL 1.001s and WaitTimeout 1s = %v, want no error before the I/O", err)
	}
}

func TestGuarantees(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: unreachable})
	defer client.Close()
	d, err := redis.NewDriverNoIO(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := d.Guarantees()
	if g.Fencing != backend.FencingBestEffort || g.ToleratedFailures != 0 || g.FIFO || !g.ClockDependent || g.Notes == "" {
		t.Errorf("Guarantees = %+v", g)
	}
	if lim := d.Limits(); lim.MinTTL != time.Millisecond || lim.MaxTTL != 0 {
		t.Errorf("Limits = %+v", lim)
	}
	var uc goredis.UniversalClient
	if !d.As(&uc) || uc != client {
		t.Errorf("As(*UniversalClient) did not return the client")
	}
}
