package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/memory"
	"github.com/dlock-go/dlock/redis"
)

// Kleppmann's pause: the first holder stalls past its lease, a second
// holder takes the lock and writes, and the first one's late write is
// rejected because its token is lower.
func ExampleGuard() {
	ctx := context.Background()
	store := memory.NewStore()
	locker, err := memory.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	var guard fence.Guard // the resource's check; one per resource owner
	balance := 0
	write := func(lease *dlock.Lease, v int) error {
		return guard.Do("accounts/7", lease.Token(), func() error { balance = v; return nil })
	}

	first, err := locker.Acquire(ctx, "accounts/7", &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	store.Expire("accounts/7") // the first holder pauses (GC, a stopped VM) past its lease

	second, err := locker.Acquire(ctx, "accounts/7", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer second.Release(ctx)
	fmt.Println("second holder writes:", write(second, 200))

	err = write(first, 100) // the first holder wakes up and writes late
	fmt.Println("first holder's late write:", err)
	fmt.Println("stale:", errors.Is(err, fence.ErrStaleToken), "balance:", balance)
	// Output:
	// second holder writes: <nil>
	// first holder's late write: fence: stale token 1 for "accounts/7": 2 was seen already
	// stale: true balance: 200
}

// Code that writes through a fenced store takes a fence.Store, so that the
// same code runs on Redis, etcd or a SQL table (redis.FenceStore,
// etcd.FenceStore, fence.SQLTable). (Not run here: it needs a Redis server.)
func ExampleStore() {
	save := func(ctx context.Context, store fence.Store, lease *dlock.Lease, order string) error {
		// An error matching fence.ErrStaleToken: the lock was lost (a
		// pause, a partition) and a newer holder has written; this write
		// was not applied.
		return store.Set(ctx, "orders/42", order, lease.Token())
	}

	ctx := context.Background()
	rdb := goredis.NewClient(&goredis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	locker, err := dlock.Open(ctx, "mem://")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	lease, err := locker.Acquire(ctx, "orders/42", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	if err := save(ctx, redis.FenceStore{Client: rdb}, lease, `{"status":"paid"}`); err != nil {
		log.Fatal(err)
	}
}
