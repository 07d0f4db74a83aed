package zookeeper_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/examplerun"
	"github.com/dlock-go/dlock/zookeeper"
)

func TestMain(m *testing.M) { startExampleServers(); os.Exit(m.Run()) }

// zkServer is the ZooKeeper server of the examples: a standalone server
// that tests/examples starts and passes in DLOCK_EXAMPLE_ZOOKEEPER
// (startExampleServers).
var zkServer = "localhost:2181"

// exampleNames are the examples of this file, which need the server.
var exampleNames = []string{"ExampleNew", "ExampleURLOpener", "Example_open"}

// startExampleServers sets zkServer from DLOCK_EXAMPLE_ZOOKEEPER
// (host:port, or a comma-separated list of which the examples use the
// first), if the run includes the examples; unset, the examples are
// skipped.
func startExampleServers() {
	if !examplerun.Selected(exampleNames...) {
		return
	}
	if addrs, ok := examplerun.FromEnv("DLOCK_EXAMPLE_ZOOKEEPER"); ok {
		zkServer, _, _ = strings.Cut(addrs, ",")
	}
}

// A Locker with its own session on the ensemble. The token is the czxid of
// the holder's lock node: a later holder always has a larger one.
func ExampleNew() {
	ctx := context.Background()
	locker, err := zookeeper.New(ctx, []string{zkServer}, &zookeeper.Options{SessionTimeout: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close() // ends the session, which deletes its lock nodes

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

// URLs with a Logger or Options of your own: register the backend's
// URLOpener on a URLMux of your own. The URL's path is the prefix znode
// and its parameters override the Options.
func ExampleURLOpener() {
	ctx := context.Background()
	mux := new(driver.URLMux)
	mux.RegisterLocker("zk", &zookeeper.URLOpener{Options: zookeeper.Options{SessionTimeout: 30 * time.Second}})
	locker, err := mux.OpenLocker(ctx, "zk://"+zkServer+"/myapp/locks?ttl=5s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.TryAcquire(ctx, "invoices", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("ttl:", lease.TTL())
	// Output: ttl: 5s
}

// dlock.Open connects to the URL's servers; dial_timeout bounds the wait
// for a session.
func Example_open() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "zk://"+zkServer+"/dlock?ttl=10s&session_timeout=30s&dial_timeout=5s")
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
