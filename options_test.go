package dlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memory"
)

// TestNegativeMaxHold: a negative MaxHold is bad input with or without
// AutoRefresh (the doc of AcquireOptions.MaxHold says so), refused before
// any I/O; a positive one without AutoRefresh bounds nothing and is
// accepted.
func TestNegativeMaxHold(t *testing.T) {
	store := memory.NewStore()
	l, err := memory.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, auto := range []bool{false, true} {
		_, err := l.TryAcquire(t.Context(), "maxhold", &dlock.AcquireOptions{AutoRefresh: auto, MaxHold: -time.Second})
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("TryAcquire with MaxHold -1s, AutoRefresh %v = %v, want ErrInvalidConfig", auto, err)
		}
		if store.Held("maxhold") {
			t.Fatalf("TryAcquire with MaxHold -1s, AutoRefresh %v took the lock", auto)
		}
	}
	le, err := l.TryAcquire(t.Context(), "maxhold", &dlock.AcquireOptions{TTL: time.Second, MaxHold: time.Millisecond})
	if err != nil {
		t.Fatalf("TryAcquire with MaxHold 1ms and no AutoRefresh: %v, want the lock (MaxHold bounds nothing then)", err)
	}
	_ = le.Release(t.Context())
}
