package driver_test

import (
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memory"
)

// A zero URLMux is ready to use, apart from the default one; DriverOf,
// LeaseOf, LockerAs, LeaseAs and Keys reach through a Locker and a Lease.
func TestZeroMuxAndReach(t *testing.T) {
	var mux driver.URLMux
	mux.RegisterLocker("mem", &memory.URLOpener{Store: memory.NewStore()})
	if !mux.ValidLockerScheme("MEM") || driver.DefaultURLMux().ValidLockerScheme("nosuch") {
		t.Fatalf("schemes: own %v, default %v", mux.LockerSchemes(), driver.DefaultURLMux().LockerSchemes())
	}
	l, err := mux.OpenLocker(t.Context(), "mem://?ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, ok := driver.DriverOf(l).(*memory.Driver); !ok {
		t.Errorf("DriverOf = %T, want *memory.Driver", driver.DriverOf(l))
	}
	le, err := l.Acquire(t.Context(), "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if bl := driver.LeaseOf(le); bl == nil || backend.Token(bl.Token()) != le.Token() {
		t.Errorf("LeaseOf = %v, want the lease of token %d", bl, le.Token())
	}
	var n *int
	if driver.LockerAs(l, nil) || driver.LockerAs(l, &n) || driver.LeaseAs(le, &n) || driver.LockerAs(nil, &n) {
		t.Errorf("As of an unsupported or nil target reported true")
	}
	if keys, err := driver.Keys(t.Context(), l, 10); err != nil || len(keys) != 1 || keys[0] != "k" {
		t.Errorf("Keys = %q, %v; want [k]", keys, err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// oldDrifter has the optional methods earlier versions read (Name,
// DriftFactor), now Guarantees.Backend and Limits.DriftFactor.
type oldDrifter struct{ backend.Driver }

func (oldDrifter) DriftFactor() float64 { return 0.2 }

type oldNamer struct{ backend.Driver }

func (oldNamer) Name() string { return "old" }

// TestOldOptionalMethodsRefused: a driver written for the earlier
// interfaces is refused with ErrInvalidConfig, not run with the default
// drift margin (a Deadline later than its algorithm allows) or an
// "unknown" name.
func TestOldOptionalMethodsRefused(t *testing.T) {
	for _, d := range []backend.Driver{oldDrifter{memory.NewDriver(memory.NewStore())}, oldNamer{memory.NewDriver(memory.NewStore())}} {
		l, err := driver.New(d, nil)
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("driver.New(%T) = %v, %v; want ErrInvalidConfig", d, l, err)
		}
	}
}
