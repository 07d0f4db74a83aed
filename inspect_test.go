package dlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memory"
)

// bareDriver hides the memory driver's optional interfaces (Inspector among
// them).
type bareDriver struct{ backend.Driver }

// countingInspector counts the Inspector calls that reach the driver.
type countingInspector struct {
	*memory.Driver
	calls int
}

func (d *countingInspector) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	d.calls++
	return d.Driver.Inspect(ctx, key)
}

func (d *countingInspector) Keys(ctx context.Context, limit int) ([]string, error) {
	d.calls++
	return d.Driver.Keys(ctx, limit)
}

func TestInspectUnsupported(t *testing.T) {
	l, err := driver.New(bareDriver{memory.NewDriver(memory.NewStore())}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.Inspect(t.Context(), "k")
	if !errors.Is(err, errors.ErrUnsupported) || !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("Inspect on a backend without Inspector: %v, want ErrUnsupported and ErrInvalidConfig", err)
	}
	var oe *dlock.OpError
	if !errors.As(err, &oe) || oe.Op != "inspect" || oe.Key != "k" {
		t.Errorf("Inspect error %#v: want an *OpError with Op inspect, Key k", err)
	}
	if _, err := driver.Keys(t.Context(), l, 10); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Keys on a backend without Inspector: %v, want ErrUnsupported", err)
	}
}

func TestInspectChecksBeforeIO(t *testing.T) {
	d := &countingInspector{Driver: memory.NewDriver(memory.NewStore())}
	l, err := driver.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Inspect(t.Context(), ""); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf("Inspect(\"\"): %v, want ErrInvalidKey", err)
	}
	if _, err := driver.Keys(t.Context(), l, -1); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("Keys(-1): %v, want ErrInvalidConfig", err)
	}
	if d.calls != 0 {
		t.Errorf("%d calls reached the driver, want none", d.calls)
	}
	if info, err := l.Inspect(t.Context(), "k"); err != nil || info.Held {
		t.Errorf("Inspect(free k) = %+v, %v", info, err)
	}
	if d.calls != 1 {
		t.Errorf("%d calls reached the driver, want 1", d.calls)
	}
	l.Close()
	if _, err := l.Inspect(t.Context(), "k"); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Inspect after Close: %v, want ErrClosed", err)
	}
	if _, err := driver.Keys(t.Context(), l, 1); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Keys after Close: %v, want ErrClosed", err)
	}
}
