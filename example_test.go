package dlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memory"
)

func Example() {
	ctx := context.Background()
	// "mem://" is the in-process backend; "redis://localhost:6379" would
	// use a Redis server with the same code.
	locker, err := dlock.Open(ctx, "mem://example?ttl=10s")
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "orders/42", nil)
	if err != nil {
		panic(err)
	}
	// Hand the token to the resource with each write; it rejects a write
	// whose token is lower than one it has seen.
	fmt.Println("held", lease.Key(), "with token", lease.Token())
	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	// Output: held orders/42 with token 1
}

func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	store := memory.NewStore()
	a, err := memory.New(store, nil)
	if err != nil {
		panic(err)
	}
	b, err := memory.New(store, nil)
	if err != nil {
		panic(err)
	}
	defer a.Close()
	defer b.Close()

	lease, _ := a.TryAcquire(ctx, "report", &dlock.AcquireOptions{TTL: time.Minute})
	_, err = b.TryAcquire(ctx, "report", nil)
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired), err)

	_ = lease.Release(ctx)
	lease, _ = b.TryAcquire(ctx, "report", nil)
	fmt.Println("b holds it, token", lease.Token())
	// Output:
	// true dlock: try-acquire "report": lock not acquired: held by another holder
	// b holds it, token 2
}

func ExampleLease_Context() {
	ctx := context.Background()
	store := memory.NewStore()
	locker, err := memory.New(store, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lease, _ := locker.Acquire(ctx, "job", &dlock.AcquireOptions{TTL: time.Minute, AutoRefresh: true})
	work, cancel := lease.Context(ctx) // ends when the lease is lost
	defer cancel()

	store.Expire("job") // the server drops the lock (in a test; in life: a partition, a pause)
	<-work.Done()
	fmt.Println(context.Cause(work))
	// Output: dlock: lease lost: expired by Store.Expire
}

// A Config names one URL per purpose; code asks for the purpose. Here both
// are the in-process backend; in production the correctness URL would name
// etcd or ZooKeeper (a Redis URL there fails to open).
func ExampleConfig() {
	var cfg dlock.Config
	_ = json.Unmarshal([]byte(`{
		"efficiency":  "mem://example-cache?ttl=10s",
		"correctness": "mem://example-orders?ttl=15s"
	}`), &cfg) // or from the environment

	locker, err := cfg.Open(context.Background(), dlock.Correctness)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()
	g := locker.Guarantees()
	fmt.Println("fencing:", g.Fencing, "clock-dependent:", g.ClockDependent)
	// Output: fencing: consensus clock-dependent: false
}

func ExampleElection() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := memory.NewStore() // one in-process backend for both candidates
	type term struct {
		who   int
		token dlock.Token
	}
	terms := make(chan term)
	var candidates [2]*dlock.Election
	for i := range candidates {
		locker, err := memory.New(store, nil)
		if err != nil {
			panic(err)
		}
		defer locker.Close()
		e, err := dlock.NewElection(locker, "jobs/report", &dlock.ElectionOptions{Holder: fmt.Sprint("replica-", i)})
		if err != nil {
			panic(err)
		}
		candidates[i] = e
		go e.Run(ctx, func(ctx context.Context, lease *dlock.Lease) error {
			terms <- term{i, lease.Token()}
			<-ctx.Done() // lead until leadership ends
			return nil
		})
	}
	first := <-terms
	leader, err := candidates[0].Leader(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("elected with term", first.token, "- Leader names it:", leader.Holder == fmt.Sprint("replica-", first.who))
	// The leader gives up; the other candidate takes over.
	if err := candidates[first.who].Resign(ctx); err != nil {
		panic(err)
	}
	next := <-terms
	fmt.Println("then term", next.token, "- another replica:", next.who != first.who)
	// Output:
	// elected with term 1 - Leader names it: true
	// then term 2 - another replica: true
}
