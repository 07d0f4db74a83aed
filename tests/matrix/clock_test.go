package matrix_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
)

// The wall clock of the servers that hold a lock (the one Redis; three of
// Redlock's five nodes) jumps forward by more than the TTL while a holder
// has a long lease, as after an NTP step or a virtual machine's resume:
// libfaketime moves the server's realtime clock, and Redis expires keys by
// it, so the lock key expires at once on those servers, while the holder's
// Deadline, kept on its own monotonic clock, is still well ahead. A
// contender is granted the lock while the holder's lease is valid. The
// holder then writes what it read (the token lets the register refuse it:
// the token's clock floor jumped forward with the clock) and releases.
func init() {
	register(&scenario{
		order:   60,
		name:    "ClockJump",
		row:     "server clock jumps forward (libfaketime) while a lock is held",
		applies: only(bRedis, bRedlock),
		expect:  expectIf(clockDependent, violation, "the lease's expiry is kept by the server's wall clock; a jump forward frees the key while the holder's Deadline is still ahead"),
		run:     runClockJump,
	})
}

const (
	// clockHolderTTL is the holder's lease: long, so that its Deadline is
	// well ahead when the clocks jump.
	clockHolderTTL = 20 * time.Second
	// clockJump is how far the clocks jump: more than the holder's TTL.
	clockJump = clockHolderTTL + 10*time.Second
)

func runClockJump(t *testing.T, e *env) {
	ctx := t.Context()
	d := e.deploy(deployOptions{faketime: true})
	holder, contender := e.locker(), e.locker()

	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	le, err := e.h.Acquire(actx, "holder", holder, e.key, &dlock.AcquireOptions{TTL: clockHolderTTL})
	cancel()
	if err != nil {
		t.Fatalf("holder's Acquire: %v", err)
	}
	read, ok := e.reg.Read(le.Token())
	if !ok {
		t.Fatalf("holder's read with token %d refused", le.Token())
	}

	// The clocks of a majority jump.
	jumped := d.servers[:len(d.servers)/2+1]
	for _, s := range jumped {
		if err := s.ShiftClock(ctx, clockJump); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("clocks of %d of %d servers moved %v forward; the holder's Deadline is %v ahead",
		len(jumped), len(d.servers), clockJump, time.Until(le.Deadline()).Round(time.Millisecond))

	// The contender tries while the holder's lease is valid (with a
	// second to spare).
	var cle *check.Lease
	for cle == nil {
		left := time.Until(le.Deadline()) - time.Second
		if left <= 0 {
			t.Logf("the contender was not granted the lock while the holder's lease was valid")
			break
		}
		actx, cancel := context.WithTimeout(ctx, min(left, 2*time.Second))
		cle, err = e.h.TryAcquire(actx, "contender", contender, e.key, &dlock.AcquireOptions{TTL: e.ttl})
		cancel()
		if err != nil {
			if !errors.Is(err, dlock.ErrNotAcquired) {
				t.Logf("contender's TryAcquire: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if cle != nil {
		t.Logf("the contender was granted the lock with the holder's Deadline %v ahead; tokens: holder %d, contender %d",
			time.Until(le.Deadline()).Round(time.Millisecond), le.Token(), cle.Token())
		e.reg.Update(ctx, cle, 50*time.Millisecond)
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		if err := cle.Release(rctx); err != nil {
			t.Errorf("contender's Release: %v", err)
		}
		rcancel()
	}

	// The holder, still within its Deadline, writes and releases.
	if e.reg.Write(le.Client(), le.ID(), le.Token(), le.Deadline(), read) {
		t.Logf("the register accepted the holder's write (token %d)", le.Token())
	} else {
		t.Logf("the register refused the holder's write (token %d): a higher token was seen", le.Token())
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if err := le.Release(rctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("holder's Release after its key expired on the servers = %v, want ErrNotHeld", err)
	}
}
