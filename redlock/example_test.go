package redlock_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/examplerun"
	"github.com/dlock-go/dlock/redlock"
)

// nodeAddrs are the independent Redis masters of the examples: their
// addresses (a comma-separated host:port list) come from
// DLOCK_EXAMPLE_REDLOCK, which tests/examples sets when it runs them
// against servers of its own (startExampleServers).
var nodeAddrs = []string{"redis1:6379", "redis2:6379", "redis3:6379"}

// exampleNames are the examples of this file, which need the servers.
var exampleNames = []string{"ExampleNew", "ExampleURLOpener", "Example_open"}

// startExampleServers sets nodeAddrs from DLOCK_EXAMPLE_REDLOCK if the run
// includes the examples; without it, the examples are skipped.
func startExampleServers() {
	if !examplerun.Selected(exampleNames...) {
		return
	}
	if addrs, ok := examplerun.FromEnv("DLOCK_EXAMPLE_REDLOCK"); ok {
		nodeAddrs = strings.Split(addrs, ",")
	}
}

// Redlock on clients of your own, one per independent master. Each client
// needs ContextTimeoutEnabled, so that the per-node timeout cuts a slow
// node's round trip.
func ExampleNew() {
	ctx := context.Background()
	var nodes []goredis.UniversalClient
	for _, addr := range nodeAddrs {
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer c.Close()
		nodes = append(nodes, c)
	}

	locker, err := redlock.New(ctx, nodes, &redlock.Options{NodeTimeout: 250 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "reports/daily", &dlock.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	g := locker.Guarantees()
	fmt.Println("held by a majority; fencing:", g.Fencing, "tolerates", g.ToleratedFailures, "node failure")
	// Output: held by a majority; fencing: best-effort tolerates 1 node failure
}

// URLs with clients, a Logger or Options of your own: register the
// backend's URLOpener on a URLMux of your own.
func ExampleURLOpener() {
	ctx := context.Background()
	var nodes []goredis.UniversalClient
	for _, addr := range nodeAddrs {
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer c.Close()
		nodes = append(nodes, c)
	}

	mux := new(driver.URLMux)
	mux.RegisterLocker("redlock", &redlock.URLOpener{
		Clients: nodes, // used instead of dialling the URL's hosts
		Options: redlock.Options{Prefix: "myapp:"},
	})
	locker, err := mux.OpenLocker(ctx, "redlock://ignored?ttl=5s&node_timeout=250ms")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close() // leaves the clients open

	lease, err := locker.Acquire(ctx, "invoices", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("ttl:", lease.TTL())
	// Output: ttl: 5s
}

// dlock.Open dials every node of the URL and fails unless a majority
// answers within dial_timeout.
func Example_open() {
	ctx := context.Background()
	url := "redlock://" + strings.Join(nodeAddrs, ",") + "?ttl=10s&node_timeout=250ms"
	locker, err := dlock.Open(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.TryAcquire(ctx, "orders/42", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held", lease.Key(), "for", lease.TTL())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: held orders/42 for 10s
}
