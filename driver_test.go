package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memory"
)

// flakyDriver is a memory driver whose releases and refreshes fail while
// down is set, as over a broken network; it counts calls made after Close.
type flakyDriver struct {
	backend.Driver
	down      atomic.Bool
	lostReply atomic.Bool // the call takes effect, but its reply is lost
	closed    atomic.Bool
	lateCalls atomic.Int32
}

func (d *flakyDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	l, err := d.Driver.TryAcquire(ctx, req)
	if err != nil {
		return nil, err
	}
	return &flakyLease{l, d}, nil
}

func (d *flakyDriver) Close() error {
	d.closed.Store(true)
	return d.Driver.Close()
}

type flakyLease struct {
	backend.Lease
	d *flakyDriver
}

func (l *flakyLease) check() error {
	if l.d.closed.Load() {
		l.d.lateCalls.Add(1)
	}
	if l.d.down.Load() {
		return fmt.Errorf("%w: network down", backend.ErrUnavailable)
	}
	return nil
}

func (l *flakyLease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	if err := l.check(); err != nil {
		return 0, err
	}
	granted, err := l.Lease.Refresh(ctx, ttl)
	if err == nil && l.d.lostReply.Load() {
		return 0, errLostReply
	}
	return granted, err
}

func (l *flakyLease) Release(ctx context.Context) error {
	if err := l.check(); err != nil {
		return err
	}
	err := l.Lease.Release(ctx)
	if err == nil && l.d.lostReply.Load() {
		return errLostReply
	}
	return err
}

var errLostReply = fmt.Errorf("%w: reply lost", backend.ErrUnavailable)

// flakyLeaseOnK returns a 10 s lease on "k" through a flakyDriver over a
// memory store; the Locker is closed when t ends.
func flakyLeaseOnK(t *testing.T) (*memory.Store, *flakyDriver, *dlock.Lease) {
	t.Helper()
	s := memory.NewStore()
	d := &flakyDriver{Driver: memory.NewDriver(s)}
	l := mustNew(t, d, nil)
	t.Cleanup(func() { l.Close() })
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s, d, le
}

// A refresh that shortened the lease on the server but whose reply was lost
// must pull the deadline in: the server may expire the lock that soon.
func TestRefreshLostReplyPullsDeadlineIn(t *testing.T) {
	_, d, le := flakyLeaseOnK(t)
	d.lostReply.Store(true)
	if err := le.Refresh(t.Context(), 50*time.Millisecond); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Refresh with a lost reply = %v, want ErrUnavailable", err)
	}
	if latest := time.Now().Add(50 * time.Millisecond); le.Deadline().After(latest) {
		t.Errorf("Deadline %v is later than %v, where a possibly applied 50ms refresh ends", le.Deadline(), latest)
	}
	select {
	case <-le.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done did not fire at the pulled-in deadline")
	}
}

// A release whose reply was lost may have freed the lock: the lease ends,
// and a second Release tries again to give it back.
func TestReleaseLostReplyEndsLease(t *testing.T) {
	s, d, le := flakyLeaseOnK(t)
	d.lostReply.Store(true)
	if err := le.Release(t.Context()); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Release with a lost reply = %v, want ErrUnavailable", err)
	}
	if err := le.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Err after an uncertain release = %v, want ErrLeaseLost", err)
	}
	if s.Held("k") {
		t.Fatal("the memory store should have released (the reply alone was lost)")
	}
	if err := le.Release(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
}

// A lease whose release fails at Close still ends, and its watchdog stops
// before the backend is closed (TestMain's goleak check covers the rest).
func TestCloseEndsLeasesItCannotRelease(t *testing.T) {
	d := &flakyDriver{Driver: memory.NewDriver(memory.NewStore())}
	l := mustNew(t, d, nil)
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 300 * time.Millisecond, AutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	d.down.Store(true)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-le.Done():
	default:
		t.Fatal("Done is open after Close")
	}
	if err := le.Err(); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Err after Close = %v, want ErrClosed", err)
	}
	time.Sleep(400 * time.Millisecond) // past a watchdog period
	if n := d.lateCalls.Load(); n != 0 {
		t.Errorf("%d backend calls after Close", n)
	}
}

// slowDriver is a memory driver whose replies come late, as from a far
// server: an acquire is sent after delay; a refresh is applied at once and
// its reply comes after refreshDelay (whatever its context: it is on its
// way). It counts the refreshes applied and the releases asked for.
type slowDriver struct {
	backend.Driver
	delay        time.Duration
	refreshDelay time.Duration
	// refreshed, if not nil, receives each refresh applied, before its
	// reply: the refresh waits until it is received or its context ends
	// (then it fails, its outcome unknown).
	refreshed chan slowRefresh
	refreshes atomic.Int32
	releases  atomic.Int32
}

// slowRefresh is a refresh a slowDriver applied.
type slowRefresh struct {
	sent    time.Time // when the call began: the request was sent then
	granted time.Duration
}

func (d *slowDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	time.Sleep(d.delay)
	l, err := d.Driver.TryAcquire(ctx, req)
	if err != nil {
		return nil, err
	}
	return &slowLease{l, d}, nil
}

type slowLease struct {
	backend.Lease
	d *slowDriver
}

func (l *slowLease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	sent := time.Now()
	granted, err := l.Lease.Refresh(ctx, ttl)
	if err != nil {
		return 0, err
	}
	l.d.refreshes.Add(1)
	time.Sleep(l.d.refreshDelay)
	if l.d.refreshed != nil {
		select {
		case l.d.refreshed <- slowRefresh{sent, granted}:
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %w", backend.ErrUnavailable, ctx.Err())
		}
	}
	return granted, nil
}

func (l *slowLease) Release(ctx context.Context) error {
	l.d.releases.Add(1)
	return l.Lease.Release(ctx)
}

// slowBatchingDriver is a slowDriver with a backend.BatchRefresher, whose
// batches refresh their leases one after another.
type slowBatchingDriver struct{ *slowDriver }

func (d slowBatchingDriver) RefreshBatch(ctx context.Context, reqs []backend.RefreshRequest) {
	for i := range reqs {
		r := &reqs[i]
		r.Granted, r.Err = r.Lease.Refresh(ctx, r.TTL)
	}
}

// driftMargin is the part of a TTL a Locker with the default drift factor
// does not trust.
func driftMargin(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*dlock.DefaultDriftFactor) + 2*time.Millisecond
}

// Deadline counts from the moment the request was sent, not from the reply:
// the server starts the TTL no earlier than it receives the request.
func TestDeadlineCountsFromRequest(t *testing.T) {
	const delay, ttl = 300 * time.Millisecond, 10 * time.Second
	l := mustNew(t, &slowDriver{Driver: memory.NewDriver(memory.NewStore()), delay: delay}, nil)
	defer l.Close()
	before := time.Now()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if latest := before.Add(delay/2 + ttl - driftMargin(ttl)); le.Deadline().After(latest) {
		t.Errorf("Deadline %v is after %v: counted from the reply, not the request", le.Deadline(), latest)
	}
}

// An acquire whose grant comes back after its own deadline (the round trip
// outlasted the TTL) must not hand out a lease that is lost already.
func TestLateGrantIsGivenBack(t *testing.T) {
	s := memory.NewStore()
	l := mustNew(t, &slowDriver{Driver: memory.NewDriver(s), delay: 150 * time.Millisecond}, nil)
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 100 * time.Millisecond})
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("TryAcquire whose grant arrived late = %v, %v; want ErrUnavailable", le, err)
	}
	if s.Held("k") {
		t.Errorf("the late grant was not given back")
	}
}

// A refreshed Deadline counts from the moment the refresh was sent, not
// from its reply: the server counts the new TTL from no later than it
// received the request, and a slow reply must not push the Deadline past
// the server's expiry. Explicit Refresh, and the watchdog's background
// refresh (through a BatchRefresher, and one lease at a time without).
func TestRefreshDeadlineCountsFromRequest(t *testing.T) {
	const delay = 300 * time.Millisecond
	check := func(t *testing.T, le *dlock.Lease, r slowRefresh) {
		t.Helper()
		bound := r.sent.Add(r.granted - driftMargin(r.granted))
		if late := le.Deadline().Sub(bound); late > delay/2 {
			t.Errorf("the refreshed Deadline is %v past the request's time + TTL - margin: counted from the reply, not the request", late)
		}
	}
	t.Run("Refresh", func(t *testing.T) {
		t.Parallel()
		d := &slowDriver{Driver: memory.NewDriver(memory.NewStore()), refreshDelay: delay, refreshed: make(chan slowRefresh, 1)}
		l := mustNew(t, d, nil)
		defer l.Close()
		le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Refresh(t.Context(), 20*time.Second); err != nil {
			t.Fatal(err)
		}
		check(t, le, <-d.refreshed)
	})
	for _, batch := range []bool{true, false} {
		t.Run(fmt.Sprint("watchdog/batch=", batch), func(t *testing.T) {
			t.Parallel()
			const ttl = 3 * time.Second
			// Only the first refresh gets its reply (the test takes
			// one from refreshed): the Deadline is that refresh's.
			sd := &slowDriver{Driver: memory.NewDriver(memory.NewStore()), refreshDelay: delay, refreshed: make(chan slowRefresh)}
			var d backend.Driver = sd
			if batch {
				d = slowBatchingDriver{sd}
			}
			l := mustNew(t, d, nil)
			defer l.Close()
			le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: ttl, AutoRefresh: true})
			if err != nil {
				t.Fatal(err)
			}
			acquired := le.Deadline()
			var r slowRefresh
			select {
			case r = <-sd.refreshed:
			case <-time.After(10 * time.Second):
				t.Fatal("no background refresh in 10 s")
			}
			// The reply is on its way: wait until it is applied.
			for end := time.Now().Add(10 * time.Second); le.Deadline().Equal(acquired); time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the background refresh did not move the Deadline in 10 s")
				}
			}
			check(t, le, r)
		})
	}
}

// A refresh whose reply lands after the lease's Deadline does not count:
// the lease ended at its Deadline (Done was closed then, or would have been
// for anyone who looked), so an explicit Refresh returns ErrNotHeld, and
// what the server extended is given back (released), whether Done was
// watched or not. The watchdog's background refresh likewise: the lease
// ends as lost and the key is given back.
func TestLateRefreshIsGivenBack(t *testing.T) {
	for _, watched := range []bool{false, true} {
		t.Run(fmt.Sprint("Refresh/watched=", watched), func(t *testing.T) {
			t.Parallel()
			const ttl = 2 * time.Second
			s := memory.NewStore()
			// Sent at once after the acquire, the refresh's reply comes
			// after the lease's Deadline (at most TTL after the acquire).
			d := &slowDriver{Driver: memory.NewDriver(s), refreshDelay: ttl + 100*time.Millisecond}
			l := mustNew(t, d, nil)
			defer l.Close()
			le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			if watched {
				le.Done()
			}
			err = le.Refresh(t.Context(), time.Minute)
			if d.refreshes.Load() != 1 {
				t.Fatalf("Refresh = %v without reaching the server: the test needs it sent before the Deadline", err)
			}
			if !errors.Is(err, dlock.ErrNotHeld) {
				t.Fatalf("Refresh whose reply came after the Deadline = %v, want ErrNotHeld", err)
			}
			if err := le.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
				t.Errorf("Err = %v, want ErrLeaseLost", err)
			}
			if d.releases.Load() != 1 || s.Held("k") {
				t.Errorf("the key is still held for the minute the late refresh gave it: not given back")
			}
		})
		t.Run(fmt.Sprint("watchdog/watched=", watched), func(t *testing.T) {
			t.Parallel()
			// The first background refresh is sent at least 0.9 TTL/3
			// after the acquire: its reply comes after the Deadline (at
			// most TTL after the acquire), while the refresh it reports
			// is still in force on the server.
			const ttl = 1500 * time.Millisecond
			d := &slowDriver{Driver: memory.NewDriver(memory.NewStore()), refreshDelay: ttl - 200*time.Millisecond}
			l := mustNew(t, slowBatchingDriver{d}, nil)
			defer l.Close()
			le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: ttl, AutoRefresh: true})
			if err != nil {
				t.Fatal(err)
			}
			if watched {
				le.Done()
			}
			acquired := le.Deadline()
			// Until the late refresh is given back, or a moved Deadline
			// shows that it counted as a success.
			for end := time.Now().Add(20 * time.Second); d.releases.Load() == 0 && le.Deadline().Equal(acquired); time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("neither a release nor a new Deadline in 20 s")
				}
			}
			if dl := le.Deadline(); !dl.Equal(acquired) {
				t.Errorf("the background refresh whose reply came after the Deadline counted as a success: Deadline moved by %v", dl.Sub(acquired))
			}
			if err := le.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
				t.Errorf("Err = %v, want ErrLeaseLost", err)
			}
			if d.releases.Load() != 1 {
				t.Errorf("no release: what the late refresh extended was not given back")
			}
		})
	}
}

// Leases that nobody releases or watches leave the Locker once expired,
// swept by later acquires, so a long-lived Locker does not accumulate them.
func TestAbandonedLeasesAreSwept(t *testing.T) {
	l := mustMem(t, memory.NewStore(), nil)
	defer l.Close()
	for i := range 10 {
		if _, err := l.TryAcquire(t.Context(), fmt.Sprint("abandoned/", i), &dlock.AcquireOptions{TTL: 20 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	for i := range 10 {
		le, err := l.TryAcquire(t.Context(), fmt.Sprint("used/", i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if n := dlock.HeldLen(l); n != 0 {
		t.Errorf("%d leases still listed; want the 10 expired ones swept", n)
	}
}

// failingDriver fails its first fail acquire attempts with ErrUnavailable,
// as a backend whose network drops a request now and then; it counts them.
type failingDriver struct {
	backend.Driver
	fail     int32
	attempts atomic.Int32
}

func (d *failingDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	if d.attempts.Add(1) <= d.fail {
		return nil, fmt.Errorf("%w: request dropped", backend.ErrUnavailable)
	}
	return d.Driver.TryAcquire(ctx, req)
}

// Acquire rides out failed attempts fewer than FailedAttempts in a row,
// gives up on the backend after FailedAttempts, and TryAcquire reports the
// first failure.
func TestAcquireRetriesFailedAttempts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fail     int32
		try      bool
		wantErr  bool
		attempts int32
	}{
		{"Acquire, transient", dlock.FailedAttempts - 1, false, false, dlock.FailedAttempts},
		{"Acquire, persistent", 100, false, true, dlock.FailedAttempts},
		{"TryAcquire", 1, true, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &failingDriver{Driver: memory.NewDriver(memory.NewStore()), fail: tc.fail}
			l := mustNew(t, d, nil)
			defer l.Close()
			acquire := l.Acquire
			if tc.try {
				acquire = l.TryAcquire
			}
			le, err := acquire(t.Context(), "k", nil)
			if got := d.attempts.Load(); got != tc.attempts {
				t.Errorf("%d attempts, want %d", got, tc.attempts)
			}
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("= %v, want the lock after %d failed attempts", err, tc.fail)
				}
				if err := le.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("= %v, %v; want ErrUnavailable (and not ErrNotAcquired)", le, err)
			}
		})
	}
}

// When ctx ends while Acquire backs off from a failed attempt, the error
// says both: the deadline, and the backend's failure.
func TestAcquireDeadlineAfterFailedAttempt(t *testing.T) {
	d := &failingDriver{Driver: memory.NewDriver(memory.NewStore()), fail: 100}
	l := mustNew(t, d, &dlock.Options{RetryMin: time.Second, RetryMax: time.Second})
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := l.Acquire(ctx, "k", nil)
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v; want ErrUnavailable, ErrNotAcquired and DeadlineExceeded", err)
	}
	if got := d.attempts.Load(); got != 1 {
		t.Errorf("%d attempts, want 1 (the deadline came during the back-off)", got)
	}
}

// watchingFailingDriver is a failingDriver that can watch for releases, as
// the Redis backend does. Its watch reports a (spurious) wake-up at once,
// or, with block, blocks until ctx ends, as a subscription to a frozen
// server would.
type watchingFailingDriver struct {
	failingDriver
	block   bool
	watches atomic.Int32
}

func (d *watchingFailingDriver) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	d.watches.Add(1)
	if d.block {
		<-ctx.Done()
		return nil, nil, ctx.Err()
	}
	ch := make(chan struct{}, 1)
	ch <- struct{}{}
	return ch, func() {}, nil
}

// After a failed attempt Acquire backs off without starting a watch (which
// could hang on a frozen server or give up wake-ups for good), and a
// wake-up does not cut the back-off short.
func TestAcquireFailureDoesNotWatch(t *testing.T) {
	for _, block := range []bool{false, true} {
		t.Run(fmt.Sprint("block=", block), func(t *testing.T) {
			d := &watchingFailingDriver{failingDriver: failingDriver{Driver: memory.NewDriver(memory.NewStore()), fail: 100}, block: block}
			l := mustNew(t, d, nil)
			defer l.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			begin := time.Now()
			_, err := l.Acquire(ctx, "k", nil)
			took := time.Since(begin)
			if !errors.Is(err, dlock.ErrUnavailable) || ctx.Err() != nil {
				t.Fatalf("Acquire of a failing backend = %v after %v; want ErrUnavailable before the deadline", err, took)
			}
			if n := d.watches.Load(); n != 0 {
				t.Errorf("%d watches started after failed attempts, want 0", n)
			}
			if n := d.attempts.Load(); n != dlock.FailedAttempts {
				t.Errorf("%d attempts, want %d", n, dlock.FailedAttempts)
			}
			// Two back-offs of at least 25ms and 50ms.
			if took < 75*time.Millisecond {
				t.Errorf("gave up after %v: the back-off was cut short", took)
			}
		})
	}
}

// Close during the back-off after a failed attempt ends Acquire with
// ErrClosed (the Locker's doing), not ErrUnavailable.
func TestCloseDuringFailureBackoff(t *testing.T) {
	d := &failingDriver{Driver: memory.NewDriver(memory.NewStore()), fail: 100}
	l := mustNew(t, d, &dlock.Options{RetryMin: time.Minute, RetryMax: time.Minute})
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(t.Context(), "k", nil)
		done <- err
	}()
	for d.attempts.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, dlock.ErrClosed) || errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("Acquire closed during its back-off = %v; want ErrClosed only", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not end when the Locker was closed")
	}
}

// hangingDriver is a memory driver whose refreshes hang until their context
// ends, as on a server that stopped answering; entered is closed when the
// first refresh begins.
type hangingDriver struct {
	backend.Driver
	entered chan struct{}
	once    sync.Once
}

func (d *hangingDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	l, err := d.Driver.TryAcquire(ctx, req)
	if err != nil {
		return nil, err
	}
	return &hangingLease{l, d}, nil
}

type hangingLease struct {
	backend.Lease
	d *hangingDriver
}

func (l *hangingLease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	l.d.once.Do(func() { close(l.d.entered) })
	<-ctx.Done()
	return 0, fmt.Errorf("%w: %w", backend.ErrUnavailable, ctx.Err())
}

// hangingRefresh returns a store, a Locker on it whose background refreshes
// hang, and an auto-refreshed 3 s lease on "k" whose first refresh has
// begun (and hangs).
func hangingRefresh(t *testing.T) (*memory.Store, *dlock.Locker, *dlock.Lease) {
	t.Helper()
	s := memory.NewStore()
	d := &hangingDriver{Driver: memory.NewDriver(s), entered: make(chan struct{})}
	l := mustNew(t, d, nil)
	t.Cleanup(func() { l.Close() })
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 3 * time.Second, AutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the watchdog did not refresh")
	}
	return s, l, le
}

// Close does not wait behind a background refresh that hangs: it cancels
// it, releases the lock (the key is free at once, not at the end of the
// TTL) and ends the lease with ErrClosed. (Before the fix Close waited until
// the lease's deadline, the lease ended as lost, and the key stayed held.)
func TestCloseCancelsHangingRefresh(t *testing.T) {
	s, l, le := hangingRefresh(t)
	deadline := le.Deadline()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !time.Now().Before(deadline) {
		t.Errorf("Close returned after the lease's deadline: it waited for the hanging refresh")
	}
	if err := le.Err(); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Err after Close = %v, want ErrClosed", err)
	}
	if s.Held("k") {
		t.Errorf("the key is still held after Close")
	}
}

// Release likewise cancels a hanging background refresh and frees the key.
func TestReleaseCancelsHangingRefresh(t *testing.T) {
	s, _, le := hangingRefresh(t)
	deadline := le.Deadline()
	if err := le.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if !time.Now().Before(deadline) {
		t.Errorf("Release returned after the lease's deadline: it waited for the hanging refresh")
	}
	if err := le.Err(); !errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Err after Release = %v, want ErrNotHeld (released)", err)
	}
	if s.Held("k") {
		t.Errorf("the key is still held after Release")
	}
}

// roundingDriver is a memory driver whose server rounds every TTL up to a
// multiple of res, as etcd does to whole seconds; it records the latest end
// of a grant it made (the moment of the call plus the TTL granted).
type roundingDriver struct {
	backend.Driver
	res    time.Duration
	floor  time.Duration // and raises every TTL to at least floor
	mu     sync.Mutex
	latest time.Time
}

func (d *roundingDriver) Limits() backend.Limits {
	lim := d.Driver.Limits()
	lim.Resolution = d.res
	lim.MinGrant = d.floor
	return lim
}

func (d *roundingDriver) round(ttl time.Duration) time.Duration {
	if ttl%d.res != 0 {
		ttl += d.res - ttl%d.res
	}
	return max(ttl, d.floor)
}

func (d *roundingDriver) granted(at time.Time, ttl time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if end := at.Add(ttl); end.After(d.latest) {
		d.latest = end
	}
}

func (d *roundingDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	now := time.Now()
	req.TTL = d.round(req.TTL)
	ttl := req.TTL
	l, err := d.Driver.TryAcquire(ctx, req)
	if err != nil {
		return nil, err
	}
	d.granted(now, ttl)
	return &roundingLease{l, d}, nil
}

type roundingLease struct {
	backend.Lease
	d *roundingDriver
}

func (l *roundingLease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	now, ttl := time.Now(), l.d.round(ttl)
	granted, err := l.Lease.Refresh(ctx, ttl)
	if err == nil {
		l.d.granted(now, granted)
	}
	return granted, err
}

// The watchdog keeps an auto-refreshed lease within MaxHold on a backend that
// rounds TTLs up: near MaxHold it asks for a TTL that ends before MaxHold
// once rounded. (Before, it asked for the time left, which the server
// rounded up past MaxHold.)
func TestMaxHoldWithRoundedTTLs(t *testing.T) {
	t.Run("rounded", func(t *testing.T) {
		testMaxHold(t, &roundingDriver{Driver: memory.NewDriver(memory.NewStore()), res: 100 * time.Millisecond}, 300*time.Millisecond, 410*time.Millisecond)
	})
	// A server that raises short TTLs to a floor (etcd's minimum lease
	// TTL) raised the first grant: the watchdog does not ask for a last
	// short TTL that it would raise past MaxHold.
	t.Run("raised", func(t *testing.T) {
		testMaxHold(t, &roundingDriver{Driver: memory.NewDriver(memory.NewStore()), res: 10 * time.Millisecond, floor: 200 * time.Millisecond}, 100*time.Millisecond, 450*time.Millisecond)
	})
}

func testMaxHold(t *testing.T, d *roundingDriver, ttl, maxHold time.Duration) {
	l := mustNew(t, d, nil)
	defer l.Close()
	start := time.Now()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: ttl, AutoRefresh: true, MaxHold: maxHold})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-le.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease outlived MaxHold by far")
	}
	d.mu.Lock()
	latest := d.latest
	d.mu.Unlock()
	// A few milliseconds pass between the watchdog's look at the clock
	// and its call.
	if bound := start.Add(maxHold + 10*time.Millisecond); latest.After(bound) {
		t.Errorf("the server's grant ends %v after the acquire began; MaxHold is %v", latest.Sub(start), maxHold)
	}
	if le.Deadline().After(start.Add(maxHold)) {
		t.Errorf("Deadline %v after the acquire began; MaxHold is %v", le.Deadline().Sub(start), maxHold)
	}

}

// A MaxHold shorter than the TTL as the server rounds it is refused before
// any I/O.
func TestMaxHoldBelowRoundedTTL(t *testing.T) {
	d := &roundingDriver{Driver: memory.NewDriver(memory.NewStore()), res: 100 * time.Millisecond}
	l := mustNew(t, d, nil)
	defer l.Close()
	_, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 250 * time.Millisecond, AutoRefresh: true, MaxHold: 250 * time.Millisecond})
	if !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("MaxHold below the rounded TTL: %v, want ErrInvalidConfig", err)
	}
	// And one shorter than the least TTL the backend grants (its MinGrant).
	d = &roundingDriver{Driver: memory.NewDriver(memory.NewStore()), res: 100 * time.Millisecond, floor: time.Second}
	l = mustNew(t, d, nil)
	defer l.Close()
	_, err = l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 300 * time.Millisecond, AutoRefresh: true, MaxHold: 500 * time.Millisecond})
	if !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("MaxHold below the backend's MinGrant: %v, want ErrInvalidConfig", err)
	}
}

// lossDriver is a memory driver whose leases report loss when its lost
// channel is closed (backend.LossNotifier) and whose releases hang until
// their context ends.
type lossDriver struct {
	backend.Driver
	lost     chan struct{}
	entered  chan struct{} // closed when a Release begins
	released sync.Once
}

func (d *lossDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	l, err := d.Driver.TryAcquire(ctx, req)
	if err != nil {
		return nil, err
	}
	return &lossLease{l, d}, nil
}

type lossLease struct {
	backend.Lease
	d *lossDriver
}

func (l *lossLease) NotifyLoss(f func(error)) {
	go func() {
		<-l.d.lost
		f(fmt.Errorf("%w: the server dropped it", backend.ErrLeaseLost))
	}()
}

func (l *lossLease) Release(ctx context.Context) error {
	l.d.released.Do(func() { close(l.d.entered) })
	<-ctx.Done()
	return fmt.Errorf("%w: %w", backend.ErrUnavailable, ctx.Err())
}

// A loss the backend reports while a Release hangs still ends the lease at
// once: the Release does not silence the loss report. (Seen failing when
// Release stopped the loss watcher with the watchdog: Err stayed nil and
// Done open until the Release gave up.)
func TestLossReportedDuringRelease(t *testing.T) {
	d := &lossDriver{Driver: memory.NewDriver(memory.NewStore()), lost: make(chan struct{}), entered: make(chan struct{})}
	l := mustNew(t, d, nil)
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel() // before Close, which waits for the Release
	released := make(chan error, 1)
	go func() { released <- le.Release(ctx) }()
	<-d.entered
	close(d.lost)
	select {
	case <-le.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not fire after the backend reported the loss during a Release")
	}
	if err := le.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Err = %v, want ErrLeaseLost", err)
	}
	cancel()
	<-released
}

// Lease.Context is cancelled, with the lease's Err as its cause, when the
// lease ends, and starts no goroutine of its own: 1,000 contexts of held
// leases add none. (Before, each Context call started a goroutine; this
// test saw 1,000 more.)
func TestLeaseContext(t *testing.T) {
	s := memory.NewStore()
	l := mustMem(t, s, nil)
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	var cancels []context.CancelFunc
	for range 1000 {
		_, cancel := le.Context(t.Context())
		cancels = append(cancels, cancel)
	}
	if grown := runtime.NumGoroutine() - before; grown > 10 {
		t.Errorf("1,000 Lease.Context calls added %d goroutines", grown)
	}
	ctx, cancel := le.Context(t.Context())
	defer cancel()
	for _, c := range cancels {
		c()
	}
	// A context whose parent ends is forgotten too.
	parent, cancelParent := context.WithCancel(t.Context())
	le.Context(parent)
	cancelParent()
	for deadline := time.Now().Add(10 * time.Second); dlock.LeaseContexts(le) != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d contexts still kept after theirs ended, want 1 (the live one)", dlock.LeaseContexts(le))
		}
	}
	if ctx.Err() != nil {
		t.Fatal("the context ended while the lease is held")
	}
	s.Expire("k")
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the context was not cancelled when the lease was lost")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, dlock.ErrLeaseLost) {
		t.Errorf("Cause = %v, want ErrLeaseLost", cause)
	}
	// A context made after the end is cancelled at once.
	ctx2, cancel2 := le.Context(t.Context())
	defer cancel2()
	if !errors.Is(context.Cause(ctx2), dlock.ErrLeaseLost) {
		t.Errorf("Context of an ended lease: Cause = %v, want ErrLeaseLost", context.Cause(ctx2))
	}
}

// A TTL so long that DefaultMaxHoldFactor × TTL overflows a Duration (ttl=300000h
// in a URL) still takes an auto-refreshed lease: the default MaxHold
// saturates instead of wrapping below the TTL.
func TestDefaultMaxHoldSaturates(t *testing.T) {
	l, err := memory.New(memory.NewStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 300000 * time.Hour, AutoRefresh: true})
	if err != nil {
		t.Fatalf("TryAcquire, TTL 300000h, AutoRefresh: %v", err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A refresh to a shorter TTL pulls the Deadline in before it is sent: the
// server shortens the lease when the request reaches it, and until the
// reply comes back the Deadline must not claim the longer TTL. (Before, the
// Deadline followed only once the reply came: for a refresh from 10s to 1s
// it was 9s past the server's expiry meanwhile.)
func TestShorteningRefreshPullsDeadlineInFirst(t *testing.T) {
	d := &slowDriver{Driver: memory.NewDriver(memory.NewStore()), refreshed: make(chan slowRefresh)}
	l := mustNew(t, d, nil)
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- le.Refresh(t.Context(), time.Second) }()
	// The server has applied the refresh; its reply is held back.
	for d.refreshes.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	inFlight := le.Deadline()
	r := <-d.refreshed
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if bound := r.sent.Add(time.Second); inFlight.After(bound) {
		t.Errorf("while the refresh to 1s was in flight (applied by the server), the Deadline was %v past the server's expiry",
			inFlight.Sub(bound).Round(time.Millisecond))
	}
}
