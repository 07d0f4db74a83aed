package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// maxFlushes bounds the pipelines one Driver has in flight at a time for
// its callers' acquires and releases (see pipe). Four, not two: with 16
// goroutines on one Driver, 9% more lock cycles per second (0.78 to 0.86
// of a raw go-redis loop's, whose pool has up to 16 round trips in flight)
// at the same server CPU per cycle (tests/bench BenchmarkCycle, w=16,
// binaries with each value run alternately); eight adds nothing but
// server CPU (about 10% more per cycle).
const maxFlushes = 4

// pipe sends the acquire and release scripts of concurrent callers of one
// Driver in shared pipelines, a group commit (see the package
// documentation, Pipelining). A script call that finds another acquire or
// release of the driver in flight joins the queue; a flusher goroutine
// (at most maxFlushes at a time, started when a call finds fewer) sends
// everything queued as one go-redis pipeline on the driver's client, wakes
// its callers, and goes on while the queue is not empty. A lone call goes
// straight to the client, so a single caller pays no goroutine handoff.
type pipe struct {
	inflight atomic.Int32 // acquires and releases in flight

	mu       sync.Mutex
	queue    []*call
	done     chan struct{} // the queue's: closed when its pipeline has run
	spare    []*call       // the slice of the last batch, reused for the queue
	flushing int           // flusher goroutines running
	closed   bool

	// ctx is the context of the pipelines (cancelled by close, which
	// then waits for the flushers); set by init.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// call is one script call in the queue.
type call struct {
	ctx  context.Context // the caller's
	cmd  *goredis.Cmd
	done chan struct{} // closed when cmd has its reply (its batch's, set by enqueue)

	// orphan is set once, either by the flusher to ranMark when the call's
	// pipeline has run (before done is closed), or before that by the
	// clean-up of an acquire cut short that stops waiting for the call
	// (see pending.abandon) to the lease whose lock the flusher then
	// deletes once the pipeline has run: go-redis may send the script
	// (again, on a lost reply) after the clean-up gave up.
	orphan atomic.Pointer[lease]
}

// ranMark marks a call whose pipeline has run (call.orphan).
var ranMark = new(lease)

func (p *pipe) init() {
	p.ctx, p.cancel = context.WithCancel(context.Background())
}

// close stops the flushers (cancelling their pipelines, which wakes their
// callers with the error) and waits for them; later calls go straight to
// the client.
func (p *pipe) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
}

// enqueue queues c, starting a flusher if fewer than maxFlushes run. It
// reports false, queuing nothing, once the pipe is closed.
func (d *Driver) enqueue(c *call) bool {
	p := &d.pipe
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	if p.done == nil {
		p.done = make(chan struct{})
	}
	c.done = p.done
	p.queue = append(p.queue, c)
	start := p.flushing < maxFlushes
	if start {
		p.flushing++
		p.wg.Add(1)
	}
	p.mu.Unlock()
	if start {
		go d.flush()
	}
	return true
}

// flush sends the queue as one pipeline, wakes its callers (closing the
// queue's done channel), and repeats until the queue is empty.
func (d *Driver) flush() {
	p := &d.pipe
	defer p.wg.Done()
	var batch []*call
	for {
		p.mu.Lock()
		if batch != nil {
			clear(batch)
			p.spare = batch[:0]
		}
		batch = p.queue
		if len(batch) == 0 {
			p.flushing--
			p.mu.Unlock()
			return
		}
		done := p.done
		p.queue, p.spare, p.done = p.spare, nil, nil
		p.mu.Unlock()

		d.exec(batch)
		var orphans []*lease
		for _, c := range batch {
			if l := c.orphan.Swap(ranMark); l != nil {
				// Abandoned by its clean-up: delete what it may
				// have taken (not if it found the lock held).
				if res, err := c.cmd.Int64(); err != nil || res >= 0 {
					orphans = append(orphans, l)
				}
			}
		}
		close(done)
		if len(orphans) > 0 {
			d.deleteOrphans(orphans)
		}
	}
}

// deleteOrphans cleans up after abandoned acquires (deleting each lock if
// still theirs, and leaving their tombstones: lease.forsaker), in one
// pipeline within cleanupTimeout. Not with the pipe's context: a Close
// waits for these clean-ups (that long at most) rather than leave the
// locks to their TTL.
func (d *Driver) deleteOrphans(orphans []*lease) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	pl := d.client.Pipeline()
	for _, l := range orphans {
		// EVAL, not EVALSHA: rare, and no NOSCRIPT round trip.
		s, keys, args := l.forsaker()
		_ = s.Eval(ctx, pl, keys, args...)
	}
	_, _ = pl.Exec(ctx) // best effort
}

// exec sends batch as one pipeline. The pipeline's
// context is the pipe's, bounded by the latest deadline of the callers'
// contexts when they all have one: no caller's context can end the
// others' commands, and none of them waits for the pipeline past its own
// deadline anyway.
func (d *Driver) exec(batch []*call) {
	ctx := d.pipe.ctx
	var latest time.Time
	for _, c := range batch {
		dl, ok := c.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	pl := d.client.Pipeline()
	for _, c := range batch {
		_ = pl.Process(ctx, c.cmd)
	}
	_, _ = pl.Exec(ctx) // the errors are in the commands
}

// pending is a script call sent through the pipe whose wait its caller's
// context cut short: it may still run.
type pending struct {
	c *call
}

// wait waits for the call until ctx ends and returns its reply (ran
// true), or ctx's error (ran false).
func (p *pending) wait(ctx context.Context) (res int64, ran bool, err error) {
	select {
	case <-p.c.done:
		res, err = p.c.cmd.Int64()
		return res, true, err
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
}

// abandon hands the lock that the call, an acquire of l, may take to the
// flusher, which deletes it once the call's pipeline has run. It reports
// false if the pipeline has run already (the caller then has the reply).
func (p *pending) abandon(l *lease) bool {
	return p.c.orphan.CompareAndSwap(nil, l)
}

// script runs s (EVALSHA, then EVAL if the server has no such script) with
// keys and args and returns its integer reply. When another acquire or
// release of this driver is in flight, the EVALSHA goes through the
// driver's pipe and ctx bounds only the wait for it; if ctx ends first,
// the returned *pending is the call, which may still run.
func (d *Driver) script(ctx context.Context, s *goredis.Script, keys []string, args []any) (int64, *pending, error) {
	p := &d.pipe
	others := p.inflight.Add(1) > 1
	defer p.inflight.Add(-1)
	// A context already ended goes to the client, which sends nothing.
	if others && ctx.Err() == nil {
		argv := make([]any, 0, 3+len(keys)+len(args))
		argv = append(argv, "evalsha", s.Hash(), len(keys))
		for _, k := range keys {
			argv = append(argv, k)
		}
		argv = append(argv, args...)
		c := &call{ctx: ctx, cmd: goredis.NewCmd(ctx, argv...)}
		if d.enqueue(c) {
			select {
			case <-c.done:
			case <-ctx.Done():
				return 0, &pending{c}, ctx.Err()
			}
			if !goredis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
				n, err := c.cmd.Int64()
				return n, nil, atDeadline(ctx, err)
			}
			// The server's script cache was flushed: EVAL, as
			// Script.Run does.
			n, err := s.Eval(ctx, d.client, keys, args...).Int64()
			return n, nil, atDeadline(ctx, err)
		}
	}
	n, err := s.Run(ctx, d.client, keys, args...).Int64()
	return n, nil, atDeadline(ctx, err)
}

// atDeadline adds context.DeadlineExceeded (or ctx's error) to err, the
// failure of a command sent with ctx, when ctx has ended or its deadline
// has passed. go-redis sets the connection's deadline from ctx's
// (ContextTimeoutEnabled), so a read can time out ("i/o timeout") an
// instant before ctx's own timer marks ctx done, on a busy machine; the
// caller must still see that its deadline ended the call (seen in CI:
// TestAcquireCancelledInFlightCleansUp got "redis: i/o timeout" alone).
func atDeadline(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w (%w)", err, cerr)
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
	}
	return err
}
