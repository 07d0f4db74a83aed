package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// reply is one node's answer to a call.
type reply struct {
	n     int64
	clock int64 // acquire: the node's clock (µs) when it granted, 0 if unknown
	err   error
}

// answer is a reply with the node it came from.
type answer struct {
	node int
	req  int // the request's index in a batch (0 otherwise)
	reply
}

// round is one call sent to each of a set of nodes. Its caller reads the
// replies as they come (wait) until the outcome is decided, then leaves:
// the replies still on their way are handed to a function of its choice
// (late), from the worker that received them. Every call is answered (by
// its deadline, or with ErrClosed), so nothing waits for ever.
type round struct {
	ch      chan answer // buffered for every call: a worker never blocks
	pending []bool      // by node: a call sent and its reply not yet read by the caller (single-request rounds)
	left    int         // calls not yet read by the caller

	calls *sync.WaitGroup // the Driver's: one count per call until its reply is handled

	mu   sync.Mutex
	late func(answer) // set when the caller leaves
}

// routed is a call to one node, for one request of a batch.
type routed struct {
	node, req int
	c         *call
}

// send starts a round: mk(i) is the call to node i, or nil for a node left
// out. Each call's deadline is timeout from now.
func (d *Driver) send(timeout time.Duration, mk func(i int) *call) *round {
	var rs []routed
	for i := range d.nodes {
		if c := mk(i); c != nil {
			rs = append(rs, routed{node: i, c: c})
		}
	}
	return d.sendMany(timeout, rs)
}

// sendMany starts a round of calls to any nodes, each node's calls queued
// together (they go out in one pipeline unless a node's queue is long).
// The Driver's call count covers every call until its reply has been
// handled (Close waits for it).
func (d *Driver) sendMany(timeout time.Duration, rs []routed) *round {
	r := &round{ch: make(chan answer, len(rs)), pending: make([]bool, len(d.nodes)), left: len(rs), calls: &d.calls}
	deadline := time.Now().Add(timeout)
	byNode := make([][]*call, len(d.nodes))
	for _, x := range rs {
		r.pending[x.node] = true
		c, a := x.c, answer{node: x.node, req: x.req}
		c.deadline, c.timeout = deadline, timeout
		c.done = func(rp reply) {
			a.reply = rp
			r.deliver(a)
		}
		byNode[x.node] = append(byNode[x.node], c)
	}
	d.calls.Add(len(rs))
	for i, cs := range byNode {
		if len(cs) > 0 {
			d.disp[i].enqueue(cs...)
		}
	}
	return r
}

// deliver is a call's done: to the caller while it waits, else to late.
func (r *round) deliver(a answer) {
	r.mu.Lock()
	late := r.late
	if late == nil {
		r.ch <- a
	}
	r.mu.Unlock()
	if late != nil {
		late(a)
		r.calls.Done()
	}
}

// wait reads replies, passing each to f, until f reports the outcome
// decided, every call has been answered, timeout has passed or ctx has
// ended; it reports whether the wait ended by timeout or ctx (the nodes
// still pending then count as failed). timeout bounds the wait even if a
// node's client ignores context deadlines.
func (r *round) wait(ctx context.Context, timeout time.Duration, f func(answer) (decided bool)) (cut bool) {
	if r.left == 0 {
		return false
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for r.left > 0 {
		select {
		case a := <-r.ch:
			r.pending[a.node] = false
			r.left--
			decided := f(a)
			r.calls.Done()
			if decided {
				return false
			}
		case <-t.C:
			return true
		case <-ctx.Done():
			return true
		}
	}
	return false
}

// cutErr is the error of a node still pending when a wait was cut.
func cutErr(ctx context.Context, timeout time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("no answer before the attempt ended: %w", err)
	}
	return &nodeTimeoutError{msg: fmt.Sprintf("no answer within the per-node timeout %v", timeout)}
}

// nodeTimeoutError is a node's failure to answer within a timeout of the
// Driver's own (the per-node timeout). It does not match
// context.DeadlineExceeded: a caller who tests for that asks whether their
// own context's deadline passed, and it had not (when it had, the errors
// wrap ctx.Err()). Its Timeout method reports true, as net.Error's does.
type nodeTimeoutError struct{ msg string }

func (e *nodeTimeoutError) Error() string { return e.msg }

// Timeout reports true: the node did not answer in time.
func (e *nodeTimeoutError) Timeout() bool { return true }

// ownTimeout returns a node's error err as the Driver reports it: an error
// that matches context.DeadlineExceeded while callerCtx has not ended came
// from a timeout of the Driver's own (go-redis returns the context's error,
// or a dial's net timeout, which matches it too), and becomes a
// *nodeTimeoutError saying so ("no answer within " + within, and err's
// text): err's chain is dropped, since nothing in it can be kept without
// the match. Other errors are returned as they are. callerCtx is nil where
// no caller's context reaches the call (the per-node dispatchers run on
// their own contexts).
func ownTimeout(callerCtx context.Context, err error, within string) error {
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if callerCtx != nil && callerCtx.Err() != nil {
		return err
	}
	var nt *nodeTimeoutError
	if errors.As(err, &nt) {
		return err
	}
	return &nodeTimeoutError{msg: fmt.Sprintf("no answer within %s (%v)", within, err)}
}

// leave hands the replies not yet read to late (called once per reply,
// from the worker that got it, or from leave itself for replies already
// queued). late must not block.
func (r *round) leave(late func(answer)) {
	if late == nil {
		late = func(answer) {}
	}
	r.mu.Lock()
	r.late = late
	var queued []answer
	for {
		select {
		case a := <-r.ch:
			queued = append(queued, a)
			continue
		default:
		}
		break
	}
	r.mu.Unlock()
	for _, a := range queued {
		late(a)
		r.calls.Done()
	}
}
