package dlock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memory"
)

func TestOpenUnknownScheme(t *testing.T) {
	_, err := dlock.Open(t.Context(), "nosuch://host/x")
	if !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Fatalf("Open of an unknown scheme: %v; want ErrInvalidConfig", err)
	}
	for _, want := range []string{`"nosuch"`, "mem", "forgotten import?"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestOpenParameters(t *testing.T) {
	for _, bad := range []string{
		"mem://?ttl=0s", "mem://?ttl=abc", "mem://?ttl=-1s", "mem://?ttl=1ms", "mem://?ttl=1s&ttl=2s",
		"mem://?nosuch=1", "mem://x/some/path", "mem://user@x", "%zz://",
	} {
		l, err := dlock.Open(t.Context(), bad)
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("Open(%q) = %v, %v; want ErrInvalidConfig", bad, l, err)
		}
	}
	l, err := dlock.Open(t.Context(), "mem://params?ttl=1500ms")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", nil)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if le.TTL() != 1500*time.Millisecond {
		t.Errorf("TTL = %v; want the URL's ttl=1500ms", le.TTL())
	}
	// A second Open of the same store contends with the first.
	l2, err := dlock.Open(t.Context(), "mem://params")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer l2.Close()
	if _, err := l2.TryAcquire(t.Context(), "k", nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("TryAcquire on the same named store: %v; want ErrNotAcquired", err)
	}
}

func TestRegisterPanics(t *testing.T) {
	open := func(context.Context, *url.URL) (backend.Driver, error) { return nil, errors.New("unused") }
	for name, fn := range map[string]func(){
		"nil opener":       func() { dlock.Register("test-nil", nil) },
		"duplicate scheme": func() { dlock.Register("mem", open) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("Register did not panic")
				}
			}()
			fn()
		})
	}
}

func TestOpErrorMessage(t *testing.T) {
	err := &dlock.OpError{Op: "acquire", Key: "orders/42", Err: dlock.ErrNotAcquired}
	if got, want := err.Error(), `dlock: acquire "orders/42": lock not acquired`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("OpError does not unwrap to its cause")
	}
}

func TestGradeString(t *testing.T) {
	for g, want := range map[dlock.FencingGrade]string{dlock.FencingNone: "none", dlock.FencingBestEffort: "best-effort", dlock.FencingConsensus: "consensus"} {
		if g.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(g), g.String(), want)
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for name, o := range map[string]dlock.Options{
		"negative TTL":     {TTL: -time.Second},
		"TTL below floor":  {TTL: time.Microsecond},
		"negative retry":   {RetryMin: -time.Millisecond},
		"max below min":    {RetryMin: time.Second, RetryMax: time.Millisecond},
		"drift factor 0.5": {DriftFactor: 0.5},
		"negative drift":   {DriftFactor: -0.1},
	} {
		t.Run(name, func(t *testing.T) {
			l := memory.New(memory.NewStore(), &o)
			defer l.Close()
			_, err := l.TryAcquire(t.Context(), "k", nil)
			if !errors.Is(err, dlock.ErrInvalidConfig) && !errors.Is(err, dlock.ErrInvalidTTL) {
				t.Errorf("TryAcquire with Options %+v = %v; want ErrInvalidConfig or ErrInvalidTTL", o, err)
			}
		})
	}
}
