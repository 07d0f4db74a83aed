package memory_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memory"
)

// Lockers on one Store contend for the same keys, as two processes on one
// server would: a stand-in for a real backend in unit tests.
func ExampleNew() {
	ctx := context.Background()
	store := memory.NewStore()
	a, err := memory.New(store, &dlock.Options{TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := memory.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	lease, err := a.TryAcquire(ctx, "reports/daily", nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "reports/daily", nil)
	fmt.Println("b while a holds it:", errors.Is(err, dlock.ErrNotAcquired))
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	lease, err = b.TryAcquire(ctx, "reports/daily", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("b after a released it: token", lease.Token())
	// Output:
	// b while a holds it: true
	// b after a released it: token 2
}

// A URLOpener with a Store of your own: code that opens a URL (from its
// configuration) gets the test's store.
func ExampleURLOpener() {
	ctx := context.Background()
	store := memory.NewStore()
	mux := new(driver.URLMux)
	mux.RegisterLocker("mem", &memory.URLOpener{Store: store})

	locker, err := mux.OpenLocker(ctx, "mem://ignored?ttl=5s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	lease, err := locker.Acquire(ctx, "orders/42", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("held in the test's store:", store.Held("orders/42"), "ttl:", lease.TTL())
	// Output: held in the test's store: true ttl: 5s
}

// Store.Expire drops a lock as a server would after a pause or a
// partition, so a test can check what the holder does when its lease is
// lost.
func ExampleStore_Expire() {
	ctx := context.Background()
	store := memory.NewStore()
	locker, err := memory.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "job", &dlock.AcquireOptions{TTL: time.Minute, AutoRefresh: true})
	if err != nil {
		log.Fatal(err)
	}
	store.Expire("job")
	<-lease.Done()
	fmt.Println(errors.Is(lease.Err(), dlock.ErrLeaseLost), lease.Err())
	fmt.Println("release:", errors.Is(lease.Release(ctx), dlock.ErrNotHeld))
	// Output:
	// true dlock: lease lost: expired by Store.Expire
	// release: true
}
