package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
)

// pauseTTL is the first holder's lease TTL in the stale-write part: it
// pauses past it.
const pauseTTL = 2 * time.Second

func init() {
	register(&command{name: "demo", short: "show a fencing token rejecting a stale holder's write", run: demoCmd})
}

const demoUsage = `usage: dlock demo [URL]

Demo takes a lock, writes through a fencing check, and shows the check
rejecting a stale holder's late write, on the backend at URL (default
mem://, the in-process backend, which needs no server):

	dlock demo                                  # in-process, no server
	dlock demo etcd://127.0.0.1:2379            # the etcd of dlock serve
	dlock demo redis://localhost:6379           # a Redis server
	dlock demo redlock://h1:6379,h2:6379,h3:6379 # Redlock on independent masters
	dlock demo zk://localhost:2181              # a ZooKeeper ensemble

First, three workers contend for one key and write to a resource that
accepts a write only with a token at least as high as the highest it has
seen (a fence.Guard), as a real protected resource must. Then two holders
take another key in turn: the first pauses (a GC pause, a stopped VM)
past its TTL, the second takes the lock and writes, and the first one's
late write is rejected with fence.ErrStaleToken. It uses the keys
dlock-demo/counter and dlock-demo/account.

Opening the URL has a 10 s timeout; a failure says what failed.

Exit status: 0 when the stale write was rejected, 1 on failure, 2 for a
usage error.
`

// demoCmd is dlock demo.
func demoCmd(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet("demo", demoUsage)
	if status, ok := parseFlags(e, "demo", fs, args); !ok {
		return status
	}
	rawURL := "mem://"
	switch rest := fs.Args(); len(rest) {
	case 0:
	case 1:
		rawURL = rest[0]
	default:
		return usageFail(e, "demo", "too many arguments: want [URL]")
	}
	if err := demo(ctx, e.stdout, rawURL); err != nil {
		fmt.Fprintf(e.stderr, "dlock demo: %s\n", printable(err.Error()))
		return exitFailure
	}
	return exitOK
}

// demoOpen opens rawURL within openTimeout; its error names the URL
// (without its password) and the timeout.
func demoOpen(ctx context.Context, rawURL string) (*dlock.Locker, error) {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	locker, err := dlock.Open(ctx, rawURL)
	if err != nil {
		return nil, fmt.Errorf("opening %s (timeout %v) failed: %w", redacted(rawURL), openTimeout, err)
	}
	return locker, nil
}

func demo(ctx context.Context, w io.Writer, rawURL string) error {
	locker, err := demoOpen(ctx, rawURL)
	if err != nil {
		return err
	}
	defer locker.Close()
	g := locker.Guarantees()
	fmt.Fprintf(w, "backend %s: fencing %v, tolerates %d node failures, clock-dependent %v\n",
		redacted(rawURL), g.Fencing, g.ToleratedFailures, g.ClockDependent)

	var guard fence.Guard // the protected resource's token check
	if err := demoContend(ctx, w, locker, &guard); err != nil {
		return err
	}
	return demoStaleWrite(ctx, w, rawURL, locker, &guard)
}

// demoContend runs three workers that each take the lock and increment a
// counter through the guard.
func demoContend(ctx context.Context, out io.Writer, locker *dlock.Locker, guard *fence.Guard) error {
	var (
		mu      sync.Mutex
		counter int
		wg      sync.WaitGroup
	)
	errs := make(chan error, 3)
	for w := 1; w <= 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			lease, err := locker.Acquire(ctx, "dlock-demo/counter", &dlock.AcquireOptions{TTL: 10 * time.Second})
			if err != nil {
				errs <- fmt.Errorf("worker %d: %w", w, err)
				return
			}
			defer lease.Release(context.WithoutCancel(ctx))
			mu.Lock()
			v := counter + 1
			mu.Unlock()
			time.Sleep(50 * time.Millisecond) // work done under the lock
			err = guard.Do("counter", lease.Token(), func() error {
				mu.Lock()
				counter = v
				mu.Unlock()
				return nil
			})
			if err != nil {
				errs <- fmt.Errorf("worker %d: %w", w, err)
				return
			}
			fmt.Fprintf(out, "worker %d held the lock with token %d and wrote %d\n", w, lease.Token(), v)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Fprintf(out, "counter %d, highest token %d\n", counter, guard.Highest("counter"))
	return nil
}

// demoStaleWrite is Kleppmann's pause: holder 1 takes the lock with a short
// TTL and pauses past it; holder 2 (a Locker of its own, as another
// process would have) takes the lock and writes; holder 1 wakes up and
// writes with its old token, which the guard rejects.
func demoStaleWrite(ctx context.Context, out io.Writer, rawURL string, locker2 *dlock.Locker, guard *fence.Guard) error {
	const key = "dlock-demo/account"
	var (
		mu    sync.Mutex
		value string
	)
	write := func(token dlock.Token, v string) error {
		return guard.Do("account", token, func() error {
			mu.Lock()
			value = v
			mu.Unlock()
			return nil
		})
	}

	locker1, err := demoOpen(ctx, rawURL)
	if err != nil {
		return err
	}
	defer locker1.Close()
	lease1, err := locker1.Acquire(ctx, key, &dlock.AcquireOptions{TTL: pauseTTL})
	if err != nil {
		return fmt.Errorf("holder 1: %w", err)
	}
	fmt.Fprintf(out, "holder 1: acquired %s with token %d (TTL %v), then pauses past its TTL\n", key, lease1.Token(), lease1.TTL())

	// Holder 2 waits for the lock meanwhile.
	type result struct {
		lease *dlock.Lease
		err   error
	}
	acquired := make(chan result, 1)
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		lease, err := locker2.Acquire(ctx2, key, nil)
		acquired <- result{lease, err}
	}()

	// While holder 1 is paused its lease runs out. In a real pause its
	// process stops, connection and session included: the Close stands
	// for that (on ZooKeeper the lock lives as long as the session; on
	// the other backends the server expires it after the TTL anyway).
	<-lease1.Done()
	fmt.Fprintf(out, "holder 1 is still paused; its lease ended: %v\n", lease1.Err())
	_ = locker1.Close()

	r := <-acquired
	if r.err != nil {
		return fmt.Errorf("holder 2: %w", r.err)
	}
	defer r.lease.Release(context.WithoutCancel(ctx))
	if err := write(r.lease.Token(), "written by holder 2"); err != nil {
		return fmt.Errorf("holder 2: %w", err)
	}
	fmt.Fprintf(out, "holder 2: acquired %s with token %d and wrote\n", key, r.lease.Token())

	// Holder 1 wakes up, unaware, and writes with its old token.
	err = write(lease1.Token(), "written by holder 1, late")
	if !errors.Is(err, fence.ErrStaleToken) {
		return fmt.Errorf("holder 1's late write with token %d: %v; want it rejected as stale", lease1.Token(), err)
	}
	fmt.Fprintf(out, "holder 1: wakes up, writes with token %d: rejected: %v\n", lease1.Token(), err)
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(out, "done: the resource holds %q\n", value)
	return nil
}
