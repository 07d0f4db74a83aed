package redis_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/examplerun"
	"github.com/dlock-go/dlock/redis"
)

// redisAddr is the Redis server of the examples: its address (host:port)
// comes from DLOCK_EXAMPLE_REDIS, which tests/examples sets when it runs
// them against a server of its own (startExampleServers).
var redisAddr = "localhost:6379"

// exampleNames are the examples of this file, which need the server.
var exampleNames = []string{"ExampleNew", "ExampleURLOpener", "Example_open"}

// startExampleServers sets redisAddr from DLOCK_EXAMPLE_REDIS if the run
// includes the examples; without it, the examples are skipped.
func startExampleServers() {
	if !examplerun.Selected(exampleNames...) {
		return
	}
	if addr, ok := examplerun.FromEnv("DLOCK_EXAMPLE_REDIS"); ok {
		redisAddr = addr
	}
}

// A Locker on a client of your own: one holder at a time, and each new
// holder gets a larger fencing token.
func ExampleNew() {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr}) // e.g. "localhost:6379"
	defer client.Close()

	locker, err := redis.New(ctx, client, &redis.Options{Locker: &dlock.Options{TTL: 10 * time.Second}})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.TryAcquire(ctx, "reports/daily", nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = locker.TryAcquire(ctx, "reports/daily", nil)
	fmt.Println("second attempt:", errors.Is(err, dlock.ErrNotAcquired))

	// Pass lease.Token() with every write to the protected resource.
	first := lease.Token()
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	lease, err = locker.TryAcquire(ctx, "reports/daily", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("next holder's token is larger:", lease.Token() > first)
	// Output:
	// second attempt: true
	// next holder's token is larger: true
}

// URLs with a client, Logger or Options of your own: register the
// backend's URLOpener on a URLMux of your own. The URL's parameters
// override the Options.
func ExampleURLOpener() {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	defer client.Close()

	mux := new(driver.URLMux)
	mux.RegisterLocker("redis", &redis.URLOpener{
		Client:  client, // used instead of dialling the URL's host
		Options: redis.Options{Prefix: "myapp:"},
	})
	locker, err := mux.OpenLocker(ctx, "redis://cache?ttl=5s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close() // leaves client open

	lease, err := locker.Acquire(ctx, "invoices", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	n, err := client.Exists(ctx, "myapp:{invoices}").Result()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ttl:", lease.TTL(), "key under the prefix:", n == 1)
	// Output: ttl: 5s key under the prefix: true
}

// dlock.Open dials the URL's server (the import of this package registers
// redis:// and rediss://); dial_timeout bounds the first round trip.
func Example_open() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "redis://"+redisAddr+"?ttl=10s&dial_timeout=5s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "orders/42", &dlock.AcquireOptions{AutoRefresh: true})
	if err != nil {
		log.Fatal(err)
	}
	work, cancel := lease.Context(ctx) // cancelled if the lease is lost
	defer cancel()
	_ = work // the work, passing lease.Token() to the resource
	fmt.Println("held", lease.Key(), "for", lease.TTL())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: held orders/42 for 10s
}
