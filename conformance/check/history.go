// Package check records the history of a lock workload and checks it: the
// operations of concurrent clients with their real-time intervals (acquire
// invoked and returned, with token, TTL and Deadline; refreshes; Done
// fired; release; writes to a fenced register; faults), and the properties
// a lock service promises over them:
//
//   - mutual exclusion among valid leases: no two leases on one key are
//     valid at once, where a lease is valid from its acquire's return until
//     the first of its Deadline (the furthest shown to the holder since
//     the last recorded Refresh, or else since the grant), its Done, its
//     release being invoked, and an injected expiry of its key; shared
//     leases ([Op].Shared: semaphore
//     permits, readers) may be valid together, never with an exclusive
//     one, and never more of them than their Permits (when > 0);
//   - token order (per key): an acquire invoked after another returned
//     gets a strictly larger token, and so does a lease whose validity
//     began after another's ended (unless both are shared: two shared
//     grants' replies may come back in either order);
//   - the fenced register: no lost update (every accepted write read the
//     value of the previous accepted write) and no accepted write whose
//     token is lower than or equal to another lease's accepted token;
//   - liveness: while an acquire waits, no lease on its key is valid and
//     no fault is declared, some acquire on the key is granted within a
//     bound (so a key whose holder died is free soon after the holder's
//     lease ran out), and no acquire fails with [dlock.ErrUnavailable]
//     outside a fault.
//
// A [History] is safe for concurrent use. Record through it ([History.Acquire],
// [Lease.Release], [Register.Write]) or by hand ([History.Add]) for
// operations made elsewhere, such as in another process; then call [Check].
// The checker is independent of any backend: users can run it on their own
// workloads and servers.
package check

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
)

// Kind is what an [Op] records.
type Kind int

// The kinds of operation.
const (
	// Acquire is a call to Acquire (Wait true) or TryAcquire (Wait false):
	// Start when invoked, End when it returned, Err nil if it granted a
	// lease (then Token, TTL and Deadline are the lease's).
	Acquire Kind = iota + 1
	// Release is a call to Release on the lease Lease: Start when invoked,
	// End when it returned, Deadline the lease's Deadline at Start.
	Release
	// Lost is the Done of lease Lease firing before its release was
	// invoked (Start = End = when it was seen), Err the lease's Err,
	// Deadline the lease's Deadline then (refreshed since the grant).
	Lost
	// Write is a write to a fenced register by lease Lease with Token,
	// refused (Accepted false) or accepted; Read is the value the writer
	// read before, Wrote the value it wrote; Seq orders the register's
	// writes. Deadline is the lease's Deadline when the write was made
	// (zero if unknown).
	Write
	// Expire is a fault that made the server drop the lock on Key, by a
	// call made from Start to End: the lease with Token (the lock
	// dropped), or with Token 0 any lease whose acquire was invoked before
	// End, is valid at most until Start.
	Expire
	// Fault is a window [Start, End] in which a fault may stop progress
	// (a server down, a holder paused with the lock). Name says which.
	// Liveness is not required inside it; it applies to every key.
	Fault
	// Refresh is a call to Refresh on lease Lease that succeeded: Start
	// when invoked, End when it returned, Deadline the lease's Deadline
	// after it. From End on, the lease is valid until that Deadline, even
	// where an earlier observation saw a later one: the holder asked for
	// the new TTL, and a Refresh to a shorter TTL shortens the lease.
	// (Other observations only extend it: see Check.)
	Refresh
)

// String returns the kind's name, such as "acquire".
func (k Kind) String() string {
	switch k {
	case Acquire:
		return "acquire"
	case Release:
		return "release"
	case Lost:
		return "lost"
	case Write:
		return "write"
	case Expire:
		return "expire"
	case Fault:
		return "fault"
	case Refresh:
		return "refresh"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Op is one operation of a history.
type Op struct {
	ID     int    // set by History.Add: 1, 2, …
	Kind   Kind   //
	Client string // who made it, for reports
	Key    string // the lock key (a register's key for Write)
	// Start and End bound the operation in real time (equal for an
	// instant).
	Start, End time.Time
	// Lease is the ID of the Acquire op that granted the lease, for
	// Release, Lost and Write.
	Lease int
	Wait  bool // Acquire: a waiting Acquire rather than TryAcquire
	// Shared and Permits: an Acquire of a shared lease (a reader, or one
	// of Permits permits of a semaphore; dlock.AcquireOptions).
	Shared   bool
	Permits  int
	Token    dlock.Token   // Acquire (granted) and Write
	TTL      time.Duration // Acquire (granted)
	Deadline time.Time     // Acquire, Release, Lost, Write, Refresh: the lease's Deadline then
	Err      error         // Acquire, Release, Lost
	Accepted bool          // Write
	Read     int64         // Write: the value read before
	Wrote    int64         // Write: the value written
	Seq      int           // Write: position in the register's order
	Name     string        // Fault: what the fault is
}

// Granted reports whether op is an Acquire that granted a lease.
func (op Op) Granted() bool { return op.Kind == Acquire && op.Err == nil }

// History is a concurrent record of operations. The zero value is not
// usable; call [NewHistory].
type History struct {
	begin time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewHistory returns an empty history whose reports give times relative to
// now.
func NewHistory() *History { return &History{begin: time.Now()} }

// Begin returns the time the history started.
func (h *History) Begin() time.Time { return h.begin }

// Add records op, made elsewhere, and returns its ID.
func (h *History) Add(op Op) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.ID = len(h.ops) + 1
	h.ops = append(h.ops, op)
	return op.ID
}

// Ops returns a copy of the operations recorded so far, in the order they
// were recorded.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Expire records that the server was made to drop the lock on key by a
// call made from start to end. token is the token of the lock dropped, if
// the call could tell (0 if not): the lease with that token is valid at
// most until start. With token 0, any lease whose acquire was invoked
// before end may have been the one dropped: the validity of each ends at
// start (for the safety checks; progress treats such a lease as held, as
// it may have been granted after the drop).
func (h *History) Expire(key string, token dlock.Token, start, end time.Time) {
	h.Add(Op{Kind: Expire, Key: key, Token: token, Start: start, End: end})
}

// Fault records a fault window named name from start to end, in which
// progress is not required.
func (h *History) Fault(name string, start, end time.Time) {
	h.Add(Op{Kind: Fault, Name: name, Start: start, End: end})
}

// Acquire calls l.Acquire and records it for client.
func (h *History) Acquire(ctx context.Context, client string, l *dlock.Locker, key string, o *dlock.AcquireOptions) (*Lease, error) {
	return h.acquire(ctx, client, l, key, o, true)
}

// TryAcquire calls l.TryAcquire and records it for client.
func (h *History) TryAcquire(ctx context.Context, client string, l *dlock.Locker, key string, o *dlock.AcquireOptions) (*Lease, error) {
	return h.acquire(ctx, client, l, key, o, false)
}

func (h *History) acquire(ctx context.Context, client string, l *dlock.Locker, key string, o *dlock.AcquireOptions, wait bool) (*Lease, error) {
	op := Op{Kind: Acquire, Client: client, Key: key, Wait: wait, Start: time.Now()}
	if o != nil {
		op.Shared, op.Permits = o.Shared || o.Permits > 0, o.Permits
	}
	var le *dlock.Lease
	if wait {
		le, op.Err = l.Acquire(ctx, key, o)
	} else {
		le, op.Err = l.TryAcquire(ctx, key, o)
	}
	op.End = time.Now()
	if op.Err != nil {
		h.Add(op)
		return nil, op.Err
	}
	op.Token, op.TTL, op.Deadline = le.Token(), le.TTL(), le.Deadline()
	r := &Lease{Lease: le, h: h, client: client, id: h.Add(op), released: make(chan struct{})}
	go r.watch()
	return r, nil
}

// Granted records le, granted to client outside the History — to the
// leader of a dlock.Election, which receives its lease — as an Acquire
// invoked at invoked and returned now, and watches it for loss as Acquire
// does. Call GivenUp when the holder gives it up.
func (h *History) Granted(client string, le *dlock.Lease, invoked time.Time) *Lease {
	op := Op{Kind: Acquire, Client: client, Key: le.Key(), Wait: true, Start: invoked, End: time.Now(),
		Token: le.Token(), TTL: le.TTL(), Deadline: le.Deadline()}
	r := &Lease{Lease: le, h: h, client: client, id: h.Add(op), released: make(chan struct{})}
	go r.watch()
	return r
}

// GivenUp records that the holder stops using the lease now and that its
// owner (a dlock.Election) releases it, as Release would record a release
// invoked now, without calling Release.
func (le *Lease) GivenUp() {
	op := Op{Kind: Release, Client: le.client, Key: le.Key(), Lease: le.id, Start: time.Now(), Deadline: le.Deadline()}
	le.once.Do(func() { close(le.released) })
	op.End = op.Start
	le.h.Add(op)
}

// Lease is a granted lease whose Release and loss are recorded. Its
// embedded *dlock.Lease is the lease itself.
type Lease struct {
	*dlock.Lease
	h      *History
	client string
	id     int

	once     sync.Once
	released chan struct{} // closed when Release is invoked
}

// ID returns the ID of the Acquire op that granted the lease.
func (le *Lease) ID() int { return le.id }

// Client returns the client that holds the lease.
func (le *Lease) Client() string { return le.client }

// watch records Done firing before Release is invoked.
func (le *Lease) watch() {
	select {
	case <-le.released:
	case <-le.Done():
		select {
		case <-le.released:
			return // Done fired by the release
		default:
		}
		now := time.Now()
		le.h.Add(Op{Kind: Lost, Client: le.client, Key: le.Key(), Lease: le.id, Start: now, End: now, Err: le.Err(), Deadline: le.Deadline()})
	}
}

// Refresh calls Refresh on the lease and records it if it succeeded.
func (le *Lease) Refresh(ctx context.Context, ttl time.Duration) error {
	op := Op{Kind: Refresh, Client: le.client, Key: le.Key(), Lease: le.id, Start: time.Now()}
	if err := le.Lease.Refresh(ctx, ttl); err != nil {
		return err
	}
	op.End, op.Deadline = time.Now(), le.Deadline()
	le.h.Add(op)
	return nil
}

// Release calls Release on the lease and records it.
func (le *Lease) Release(ctx context.Context) error {
	op := Op{Kind: Release, Client: le.client, Key: le.Key(), Lease: le.id, Start: time.Now(), Deadline: le.Deadline()}
	le.once.Do(func() { close(le.released) })
	op.Err = le.Lease.Release(ctx)
	op.End = time.Now()
	le.h.Add(op)
	return op.Err
}

// Register is a fenced register, as a resource that checks fencing tokens
// would be: reads and writes carry the holder's token and are refused when
// a higher token has been seen. Its writes are recorded in a History.
type Register struct {
	h   *History
	key string

	mu      sync.Mutex
	highest dlock.Token
	value   int64
	seq     int
}

// NewRegister returns a register named key (use the lock's key), recording
// into h.
func NewRegister(h *History, key string) *Register { return &Register{h: h, key: key} }

// Read returns the value for a holder of token, or false if a higher token
// has been seen.
func (r *Register) Read(token dlock.Token) (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token < r.highest {
		return 0, false
	}
	r.highest = token
	return r.value, true
}

// Write sets the value to read+1 for the lease with ID lease (held by
// client, with token and deadline) that read read, unless a higher token has
// been seen, and records the write. It reports whether it was accepted.
func (r *Register) Write(client string, lease int, token dlock.Token, deadline time.Time, read int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.seq++
	op := Op{Kind: Write, Client: client, Key: r.key, Lease: lease, Token: token, Deadline: deadline,
		Read: read, Wrote: read + 1, Seq: r.seq, Start: now, End: now}
	if token >= r.highest {
		r.highest = token
		r.value = read + 1
		op.Accepted = true
	}
	r.h.Add(op)
	return op.Accepted
}

// Update reads the register with le's token, waits hold (the critical
// section), and writes back the value read plus one, recording the write.
// It reports whether the read and the write were both accepted. A read that
// is refused ends it without a write.
func (r *Register) Update(ctx context.Context, le *Lease, hold time.Duration) bool {
	v, ok := r.Read(le.Token())
	if !ok {
		return false
	}
	t := time.NewTimer(hold)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return r.Write(le.client, le.id, le.Token(), le.Deadline(), v)
}

// errUnavailable reports whether err is the backend failing, rather than
// a timeout: the acquire's own context ending (an attempt cut by the
// deadline is reported as both), or a request cut by a timeout of the
// client's own (an error in the chain whose Timeout method reports true:
// a network i/o timeout, Redlock's per-node timeout), which a loaded
// machine causes with no fault injected. The progress rule judges those:
// a lock that keeps timing out makes no progress.
func errUnavailable(err error) bool {
	var t interface{ Timeout() bool }
	if errors.As(err, &t) && t.Timeout() {
		return false
	}
	return errors.Is(err, dlock.ErrUnavailable) &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}
