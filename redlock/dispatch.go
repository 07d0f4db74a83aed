package redlock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
)

// The per-node dispatchers. Every script the Driver runs on a node goes
// through the node's queue; a long-lived worker per node takes what is
// queued and sends it as one pipeline (one write, one read), so concurrent
// attempts, releases and the watchdog's refresh batches share round trips,
// and no goroutine is started per node per call (a fresh goroutine grows
// its stack through go-redis's call depth on every call).
//
// The calls to one node run in the order they were queued: a pipeline is
// sent once the one before it has been answered. So a release queued
// while its acquire is still on its way runs after that acquire on the
// node (unless the acquire's round trip was cut at its deadline: a command
// already written may then still run later).
const (
	// workersPerNode is the number of pipelines in flight to one node;
	// more than one would break the order above.
	workersPerNode = 1
	// maxPipeline is the most calls one pipeline carries; the rest wait
	// for the next worker.
	maxPipeline = 1024
)

// call is one script run on one node.
type call struct {
	script   *goredis.Script
	keys     []string
	args     []any
	deadline time.Time // the round trip is cut here (a call queued past it fails unsent, unless keep)
	timeout  time.Duration
	// keep: a clean-up (a delete, a token write-back) is sent even when
	// it was queued past its deadline, with its timeout from then: late
	// is better than never (a key left behind blocks the lock for its
	// TTL), and it changes nothing that is not ours.
	keep  bool
	parse func(v any, err error) reply
	done  func(r reply) // called exactly once, by a worker; must not block
}

// dispatcher queues the calls to one node.
type dispatcher struct {
	node   int
	c      goredis.UniversalClient
	mu     sync.Mutex
	q      []*call
	closed bool
	signal chan struct{} // capacity 1: something is queued
	quit   chan struct{} // closed by close
	wg     sync.WaitGroup
}

func newDispatcher(node int, c goredis.UniversalClient) *dispatcher {
	p := &dispatcher{node: node, c: c, signal: make(chan struct{}, 1), quit: make(chan struct{})}
	for range workersPerNode {
		p.wg.Go(p.work)
	}
	return p
}

// enqueue queues calls to be sent together; after close, they fail at
// once with ErrClosed.
func (p *dispatcher) enqueue(calls ...*call) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		for _, c := range calls {
			c.done(reply{err: fmt.Errorf("node %d: %w", p.node, backend.ErrClosed)})
		}
		return
	}
	p.q = append(p.q, calls...)
	p.mu.Unlock()
	p.wake()
}

func (p *dispatcher) wake() {
	select {
	case p.signal <- struct{}{}:
	default:
	}
}

// take removes up to maxPipeline calls from the queue, and wakes another
// worker if more remain.
func (p *dispatcher) take() []*call {
	p.mu.Lock()
	n := min(len(p.q), maxPipeline)
	batch := p.q[:n:n]
	p.q = p.q[n:]
	if len(p.q) == 0 {
		p.q = nil
	}
	more := len(p.q) > 0
	p.mu.Unlock()
	if more {
		p.wake()
	}
	return batch
}

func (p *dispatcher) work() {
	for {
		select {
		case <-p.signal:
			if batch := p.take(); len(batch) > 0 {
				p.send(batch)
			}
		case <-p.quit:
			// close has set p.closed: nothing is queued after this.
			for batch := p.take(); len(batch) > 0; batch = p.take() {
				for _, c := range batch {
					c.done(reply{err: fmt.Errorf("node %d: %w", p.node, backend.ErrClosed)})
				}
			}
			return
		}
	}
}

// send runs batch as one pipeline, cut at the latest of the calls'
// deadlines (a call answered after its own deadline has been counted as
// failed by its round already, which then handles the late reply). Calls
// already past their deadline fail without being sent. A call cut by the
// deadline fails with a *nodeTimeoutError: the deadline is the Driver's,
// never the caller's.
func (p *dispatcher) send(batch []*call) {
	now := time.Now()
	live := batch[:0:0]
	var deadline time.Time
	for _, c := range batch {
		if c.keep && !now.Before(c.deadline) {
			c.deadline = now.Add(c.timeout)
		}
		if !now.Before(c.deadline) {
			c.done(reply{err: &nodeTimeoutError{msg: fmt.Sprintf("node %d: queued past the per-node timeout %v", p.node, c.timeout)}})
			continue
		}
		live = append(live, c)
		if c.deadline.After(deadline) {
			deadline = c.deadline
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if len(live) == 1 {
		c := live[0]
		v, err := c.script.Run(ctx, p.c, c.keys, c.args...).Result()
		c.done(c.parse(v, ownTimeout(nil, err, "the per-node timeout "+c.timeout.String())))
		return
	}
	// A call answered NOSCRIPT (the node lost its scripts, or has only
	// some of them) is sent again with EVAL after the pipeline, that is
	// after the calls behind it in the pipeline. That must not move it
	// past a later call of the same grant (say the release queued behind
	// its acquire: the release would find nothing, and the acquire, run
	// again, leave a key nothing deletes): a call followed in the
	// pipeline by another call of its grant is sent with EVAL (the
	// script's text; no NOSCRIPT). Calls of different grants may still
	// change places then, as calls of two Drivers may: each compares its
	// own value.
	later := make(map[string]bool, len(live))
	eval := make([]bool, len(live))
	for i := len(live) - 1; i >= 0; i-- {
		k := grantOf(live[i])
		eval[i] = later[k]
		later[k] = true
	}
	pipe := p.c.Pipeline()
	cmds := make([]*goredis.Cmd, len(live))
	for i, c := range live {
		if eval[i] {
			cmds[i] = c.script.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own result
	for i, c := range live {
		v, err := cmds[i].Result()
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			// The node lost its scripts (a restart): EVAL loads it.
			v, err = c.script.Eval(ctx, p.c, c.keys, c.args...).Result()
		}
		c.done(c.parse(v, ownTimeout(nil, err, "the per-node timeout "+c.timeout.String())))
	}
}

// grantOf names the grant a call is about: its lock key and ownership
// value (a token write-back names the lock's fencing counter and the
// token: it is idempotent, in any order).
func grantOf(c *call) string {
	v, _ := c.args[0].(string) // every script's first argument is a string
	return c.keys[0] + "\x00" + v
}

// close fails what is still queued with ErrClosed and waits for the
// workers (a pipeline in flight ends by its deadline).
func (p *dispatcher) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	close(p.quit)
	p.wg.Wait()
}
