// Command dlock-demo takes a lock, writes through a fencing check, and
// shows the check rejecting a stale holder's late write, with any dlock
// backend.
//
//	go run ./cmd/dlock-demo                                  # in-process backend, no server
//	go run ./cmd/dlock-demo redis://localhost:6379           # a Redis server
//	go run ./cmd/dlock-demo redlock://h1:6379,h2:6379,h3:6379 # Redlock on independent masters
//	go run ./cmd/dlock-demo etcd://localhost:2379            # an etcd cluster
//	go run ./cmd/dlock-demo zk://localhost:2181              # a ZooKeeper ensemble
//
// Opening the URL has a 10 s timeout; a failure says what failed.
//
// First, three workers contend for one key and write to a resource that
// accepts a write only with a token at least as high as the highest it has
// seen (a fence.Guard), as a real protected resource must. Then two holders
// take another key in turn: the first pauses (a GC pause, a stopped VM)
// past its TTL, the second takes the lock and writes, and the first one's
// late write is rejected with fence.ErrStaleToken.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	_ "github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/fence"
	_ "github.com/dlock-go/dlock/memory"
	_ "github.com/dlock-go/dlock/redis"
	_ "github.com/dlock-go/dlock/redlock"
	_ "github.com/dlock-go/dlock/zookeeper"
)

// openTimeout bounds each Open: with no server, Open fails by then and
// says why, instead of waiting.
const openTimeout = 10 * time.Second

// pauseTTL is the first holder's lease TTL in the stale-write part: it
// pauses past it.
const pauseTTL = 2 * time.Second

func main() {
	rawURL := "mem://"
	if len(os.Args) > 1 {
		rawURL = os.Args[1]
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, rawURL); err != nil {
		fmt.Fprintln(os.Stderr, "dlock-demo:", err)
		os.Exit(1)
	}
}

// open opens rawURL within openTimeout; its error names the URL (without
// its password) and the timeout.
func open(ctx context.Context, rawURL string) (*dlock.Locker, error) {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	locker, err := dlock.Open(ctx, rawURL)
	if err != nil {
		return nil, fmt.Errorf("opening %s (timeout %v) failed: %w", redacted(rawURL), openTimeout, err)
	}
	return locker, nil
}

// redacted is rawURL as it may be printed: without its password if it
// parses; if it does not, only its scheme ("redis://…"), or "<a URL that
// does not parse>" if it does not begin with a valid scheme and "://".
// The text of a URL that does not parse is never shown: where its
// password ends is unknown. (cmd/dlock has the same function.)
func redacted(rawURL string) string {
	u, err := url.Parse(rawURL)
	switch {
	case err != nil || atAfterHost(u, rawURL):
		if scheme, _, ok := strings.Cut(rawURL, "://"); ok && validScheme(scheme) {
			return scheme + "://…"
		}
		return "<a URL that does not parse>"
	case u.User != nil:
		return u.Redacted()
	}
	return rawURL
}

// validScheme reports whether s is a URL scheme (RFC 3986): a letter, then
// letters, digits, '+', '-' or '.'.
func validScheme(s string) bool {
	for i, c := range []byte(s) {
		letter := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || !('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return s != ""
}

func run(ctx context.Context, rawURL string) error {
	locker, err := open(ctx, rawURL)
	if err != nil {
		return err
	}
	defer locker.Close()
	g := locker.Guarantees()
	fmt.Printf("backend %s: fencing %v, tolerates %d node failures, clock-dependent %v\n",
		redacted(rawURL), g.Fencing, g.ToleratedFailures, g.ClockDependent)

	var guard fence.Guard // the protected resource's token check
	if err := contend(ctx, locker, &guard); err != nil {
		return err
	}
	return staleWrite(ctx, rawURL, locker, &guard)
}

// contend runs three workers that each take the lock and increment a
// counter through the guard.
func contend(ctx context.Context, locker *dlock.Locker, guard *fence.Guard) error {
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
			fmt.Printf("worker %d held the lock with token %d and wrote %d\n", w, lease.Token(), v)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Printf("counter %d, highest token %d\n", counter, guard.Highest("counter"))
	return nil
}

// staleWrite is Kleppmann's pause: holder 1 takes the lock with a short
// TTL and pauses past it; holder 2 (a Locker of its own, as another
// process would have) takes the lock and writes; holder 1 wakes up and
// writes with its old token, which the guard rejects.
func staleWrite(ctx context.Context, rawURL string, locker2 *dlock.Locker, guard *fence.Guard) error {
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

	locker1, err := open(ctx, rawURL)
	if err != nil {
		return err
	}
	defer locker1.Close()
	lease1, err := locker1.Acquire(ctx, key, &dlock.AcquireOptions{TTL: pauseTTL})
	if err != nil {
		return fmt.Errorf("holder 1: %w", err)
	}
	fmt.Printf("holder 1: acquired %s with token %d (TTL %v), then pauses past its TTL\n", key, lease1.Token(), lease1.TTL())

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
	fmt.Printf("holder 1 is still paused; its lease ended: %v\n", lease1.Err())
	_ = locker1.Close()

	r := <-acquired
	if r.err != nil {
		return fmt.Errorf("holder 2: %w", r.err)
	}
	defer r.lease.Release(context.WithoutCancel(ctx))
	if err := write(r.lease.Token(), "written by holder 2"); err != nil {
		return fmt.Errorf("holder 2: %w", err)
	}
	fmt.Printf("holder 2: acquired %s with token %d and wrote\n", key, r.lease.Token())

	// Holder 1 wakes up, unaware, and writes with its old token.
	err = write(lease1.Token(), "written by holder 1, late")
	if !errors.Is(err, fence.ErrStaleToken) {
		return fmt.Errorf("holder 1's late write with token %d: %v; want it rejected as stale", lease1.Token(), err)
	}
	fmt.Printf("holder 1: wakes up, writes with token %d: rejected: %v\n", lease1.Token(), err)
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("done: the resource holds %q\n", value)
	return nil
}

// atAfterHost reports whether rawURL, parsed as u, has no user information
// but an '@' after its host (in its path, query or fragment): most likely
// a password holding a '/', '?' or '#' that was not %-escaped, which
// url.Parse takes for the end of the host, and which u.Redacted would
// show. (A copy of the dlock package's, which refuses such URLs.)
func atAfterHost(u *url.URL, rawURL string) bool {
	if u.User != nil {
		return false
	}
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return false
	}
	i := strings.IndexAny(rest, "/?#")
	return i >= 0 && strings.Contains(rest[i:], "@")
}
