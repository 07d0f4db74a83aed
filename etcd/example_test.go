package etcd_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/examplerun"
)

// endpoint is the etcd member of the examples: the first of the
// endpoints in DLOCK_EXAMPLE_ETCD, which tests/examples sets when it runs
// them against a server (startExampleServers).
var endpoint = "localhost:2379"

// exampleNames are the examples of this file, which need the server.
var exampleNames = []string{"ExampleNew", "ExampleURLOpener", "Example_open", "ExampleOwnerOf"}

// The tests against real servers are in tests/etcd (the development
// module); the examples here get their server's endpoint from the
// environment (startExampleServers).
func TestMain(m *testing.M) { startExampleServers(); os.Exit(m.Run()) }

// startExampleServers sets endpoint from DLOCK_EXAMPLE_ETCD (comma-separated
// endpoints, host:port), if the run includes the examples; if it is unset,
// the examples are skipped (examplerun.FromEnv).
func startExampleServers() {
	if !examplerun.Selected(exampleNames...) {
		return
	}
	if eps, ok := examplerun.FromEnv("DLOCK_EXAMPLE_ETCD"); ok {
		endpoint, _, _ = strings.Cut(eps, ",")
	}
}

// A Locker on a client of your own. The token is the create revision of
// the holder's key: a later holder always has a larger one.
func ExampleNew() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	locker, err := etcd.New(ctx, client, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close() // leaves client open

	lease, err := locker.Acquire(ctx, "orders/42", &dlock.AcquireOptions{TTL: 15 * time.Second, AutoRefresh: true})
	if err != nil {
		log.Fatal(err)
	}
	first := lease.Token()
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	lease, err = locker.Acquire(ctx, "orders/42", &dlock.AcquireOptions{TTL: 15 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("next holder's token is larger:", lease.Token() > first)
	fmt.Println("fencing:", locker.Guarantees().Fencing)
	// Output:
	// next holder's token is larger: true
	// fencing: consensus
}

// URLs with a client, Logger or Options of your own: register the
// backend's URLOpener on a URLMux of your own. The URL's path is the key
// prefix.
func ExampleURLOpener() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	mux := new(driver.URLMux)
	mux.RegisterLocker("etcd", &etcd.URLOpener{Client: client}) // used instead of dialling the URL's hosts
	locker, err := mux.OpenLocker(ctx, "etcd://cluster/myapp/locks/?ttl=5s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "invoices", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	resp, err := client.Get(ctx, "myapp/locks/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ttl:", lease.TTL(), "keys under the prefix:", resp.Count)
	// Output: ttl: 5s keys under the prefix: 1
}

// dlock.Open dials the URL's members; dial_timeout bounds the first round
// trip, and purpose=correctness refuses a backend that cannot serve it.
func Example_open() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "etcd://"+endpoint+"/locks/?ttl=10s&dial_timeout=5s&purpose=correctness")
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

// A write to etcd itself, fenced with no extra state: the lock's ownership
// in the write's transaction, which commits only while the lock is held.
func ExampleOwnerOf() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	locker, err := etcd.New(ctx, client, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "orders/42", nil)
	if err != nil {
		log.Fatal(err)
	}
	own, _ := etcd.OwnerOf(lease)
	put := func() bool {
		resp, err := client.Txn(ctx).If(own.Cmp()).Then(clientv3.OpPut("orders/42", "paid")).Commit()
		if err != nil {
			log.Fatal(err)
		}
		return resp.Succeeded
	}
	fmt.Println("written while held:", put())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("written after release:", put())
	// Output:
	// written while held: true
	// written after release: false
}
