package redis_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redis"
)

// TestConcurrentCallsSharePipelines: acquires and releases of goroutines
// sharing one Driver go to the server in shared pipelines (two scripts or
// more per pipeline on average), also across a flushed script cache
// (NOSCRIPT, then EVAL); a lone caller's go one by one, in no pipeline;
// Close stops the driver's flushers, leaving no goroutine behind while the
// client (the caller's) stays open and usable.
func TestConcurrentCallsSharePipelines(t *testing.T) {
	h := &roundTrips{}
	c := goredis.NewClient(&goredis.Options{Addr: serverAddr(t)})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	d, err := redis.NewDriver(t.Context(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c.AddHook(h) // after NewDriver: its rights check sends a pipeline of scripts, once

	// A lone caller: no pipeline.
	key := uniqueKey(t)
	for range 20 {
		l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if commands, pipelines, _ := h.counts(); commands != 40 || pipelines != 0 {
		t.Fatalf("one caller, 20 cycles: %d scripts alone and %d pipelines, want 40 and 0", commands, pipelines)
	}

	const workers, cycles = 16, 100
	var (
		wg     sync.WaitGroup
		done   atomic.Int64
		flushd = make(chan struct{})
	)
	for w := range workers {
		wg.Go(func() {
			key := uniqueKey(t)
			for i := range cycles {
				if w == 0 && i == cycles/2 {
					// Midway: the server forgets the scripts.
					if err := c.ScriptFlush(t.Context()).Err(); err != nil {
						t.Error(err)
					}
					close(flushd)
				}
				l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 10 * time.Second})
				if err != nil {
					t.Errorf("cycle %d: TryAcquire: %v", i, err)
					return
				}
				if err := l.Release(t.Context()); err != nil {
					t.Errorf("cycle %d: Release: %v", i, err)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	<-flushd
	commands, pipelines, cmds := h.counts()
	t.Logf("%d workers × %d cycles: %d scripts alone, %d in %d pipelines", workers, cycles, commands-40, cmds, pipelines)
	if pipelines == 0 || cmds < 2*pipelines {
		t.Errorf("%d workers × %d cycles: %d scripts in %d pipelines (and %d alone), want pipelines of 2 scripts or more on average",
			workers, cycles, cmds, pipelines, commands-40)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// The client is the caller's: still open.
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("the client after Driver.Close: %v", err)
	}
}

// TestPipelinedAcquireCutLeavesNothing: acquires of concurrent goroutines
// (so most go through the driver's shared pipelines) cut short by their
// contexts leave no lock behind: the clean-up waits for the acquire sent
// before it, then deletes what it took. Every failed attempt finds its key
// absent once TryAcquire has returned.
func TestPipelinedAcquireCutLeavesNothing(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	const workers, attempts = 16, 60
	var (
		wg                  sync.WaitGroup
		granted, cut, stale atomic.Int64
	)
	for w := range workers {
		wg.Go(func() {
			for i := range attempts {
				key := uniqueKey(t)
				// Deadlines from 0 to ~3 ms: some end before the
				// reply, some after.
				ctx, cancel := context.WithTimeout(t.Context(), time.Duration((w*attempts+i)%31)*100*time.Microsecond)
				l, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: 10 * time.Second})
				cancel()
				if err == nil {
					granted.Add(1)
					if err := l.Release(t.Context()); err != nil {
						t.Errorf("Release: %v", err)
					}
					continue
				}
				if !errors.Is(err, backend.ErrUnavailable) {
					t.Errorf("TryAcquire cut short: %v, want ErrUnavailable", err)
				}
				cut.Add(1)
				if n, err := c.Exists(t.Context(), lockKey(key)).Result(); err != nil {
					t.Error(err)
				} else if n != 0 {
					stale.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d granted, %d cut short, %d of these left the lock held", granted.Load(), cut.Load(), stale.Load())
	if stale.Load() > 0 {
		t.Errorf("%d of %d acquires cut short left their lock held after TryAcquire returned", stale.Load(), cut.Load())
	}
	if cut.Load() == 0 {
		t.Errorf("no acquire was cut short (%d granted): the test tested nothing", granted.Load())
	}
}

// blockKey is a go-redis hook that holds back the commands (sent alone)
// naming one key until release is closed: an acquire of that key stays in
// flight, so that the driver's other script calls go through its pipe.
type blockKey struct {
	key     string
	release chan struct{}
	entered chan struct{} // closed when a command naming key is held back
	once    sync.Once
	// piped is sent the outcome of every pipeline once it has run (all
	// its attempts).
	piped chan error
}

func (h *blockKey) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *blockKey) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		for _, a := range cmd.Args() {
			if a == h.key {
				h.once.Do(func() { close(h.entered) })
				<-h.release
			}
		}
		return next(ctx, cmd)
	}
}

func (h *blockKey) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		select {
		case h.piped <- err:
		default:
		}
		return err
	}
}

// TestPipelinedAcquireCutThenResent: a queued acquire whose caller gave up
// (its context cancelled) and whose clean-up stopped waiting for it (its 2 s
// bound) is resent by go-redis after the clean-up's delete: its pipeline's
// reply was lost (held by a proxy until the client's 3 s ReadTimeout), and a
// pipeline is resent on a timeout, with the driver's context, which the
// caller's cancellation does not end. The resent script takes the lock
// again; nobody holds it, yet it must not stay until its TTL.
func TestPipelinedAcquireCutThenResent(t *testing.T) {
	p := newReplyDropper(t)
	p.hold = true
	h := &blockKey{key: lockKey(uniqueKey(t)), release: make(chan struct{}), entered: make(chan struct{}), piped: make(chan error, 1)}
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ReadTimeout: 3 * time.Second, MaxRetries: 3})
	c.AddHook(h)
	t.Cleanup(func() { _ = c.Close() })
	d := newDriver(t, c, nil)
	admin := serverClient(t)

	// A lone acquire held back before any I/O: in flight.
	other := make(chan error, 1)
	go func() {
		key := strings.TrimSuffix(strings.TrimPrefix(h.key, redis.DefaultPrefix+"{"), "}")
		l, err := d.TryAcquire(context.Background(), backend.Request{Key: key, TTL: time.Minute})
		if err == nil {
			err = l.Release(context.Background())
		}
		other <- err
	}()
	defer func() {
		close(h.release)
		if err := <-other; err != nil {
			t.Errorf("the held-back acquire: %v", err)
		}
	}()
	<-h.entered

	key := uniqueKey(t)
	p.armed.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute})
	if p.armed.Load() {
		t.Fatal("the proxy never saw the acquire script")
	}
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("TryAcquire cut short = %v, want ErrUnavailable", err)
	}
	select {
	case err := <-h.piped:
		t.Logf("the pipeline ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the acquire's pipeline did not end within 30 s (was it pipelined at all?)")
	}
	// Once the pipeline has run (resent or not), the lock must go soon.
	deadline := time.Now().Add(10 * time.Second)
	for admin.Exists(t.Context(), lockKey(key)).Val() != 0 {
		if time.Now().After(deadline) {
			ttl := admin.PTTL(t.Context(), lockKey(key)).Val()
			t.Fatalf("the cut acquire's lock is still there 10 s after its pipeline ended (TTL left %v): nobody holds it", ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
