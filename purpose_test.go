package dlock_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
)

func TestPurposeCheck(t *testing.T) {
	consensus := dlock.Guarantees{Fencing: dlock.FencingConsensus}
	redisLike := dlock.Guarantees{Fencing: dlock.FencingBestEffort, ClockDependent: true, Notes: "clocks"}
	for _, tc := range []struct {
		p    dlock.Purpose
		g    dlock.Guarantees
		fits bool
	}{
		{dlock.Efficiency, redisLike, true},
		{dlock.Efficiency, consensus, true},
		{dlock.Correctness, consensus, true},
		{dlock.Correctness, redisLike, false},
		{dlock.Correctness, dlock.Guarantees{Fencing: dlock.FencingConsensus, ClockDependent: true}, false},
		{dlock.Correctness, dlock.Guarantees{Fencing: dlock.FencingNone}, false},
		{dlock.Purpose("speed"), consensus, false},
	} {
		err := dlock.CheckPurpose(tc.p, tc.g)
		if (err == nil) != tc.fits || (err != nil && !errors.Is(err, dlock.ErrInvalidConfig)) {
			t.Errorf("%q.Check(%+v) = %v; want fits=%v (else ErrInvalidConfig)", tc.p, tc.g, err, tc.fits)
		}
	}
	err := dlock.CheckPurpose(dlock.Correctness, redisLike)
	for _, want := range []string{"best-effort", "clocks", "etcd or ZooKeeper", "unsafe_accept_clock_dependent_lock=true"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestOpenPurposeParameters(t *testing.T) {
	for _, bad := range []string{
		"mem://?purpose=speed", "mem://?purpose=", "mem://?purpose=correctness&purpose=efficiency",
		"mem://?unsafe_accept_clock_dependent_lock=yes",
	} {
		if _, err := dlock.Open(t.Context(), bad); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("Open(%q) = %v; want ErrInvalidConfig", bad, err)
		}
	}
	// The in-process backend serves correctness (within one process).
	l, err := dlock.Open(t.Context(), "mem://purpose?purpose=correctness")
	if err != nil {
		t.Fatalf("Open for correctness of the in-process backend: %v", err)
	}
	_ = l.Close()
}

func TestConfigOpen(t *testing.T) {
	var c dlock.Config
	if err := json.Unmarshal([]byte(`{"efficiency": "mem://cfg", "correctness": "mem://cfg?ttl=2s"}`), &c); err != nil {
		t.Fatal(err)
	}
	for _, p := range []dlock.Purpose{dlock.Efficiency, dlock.Correctness} {
		l, err := c.Open(t.Context(), p)
		if err != nil {
			t.Fatalf("Config.Open(%q): %v", p, err)
		}
		_ = l.Close()
	}
	for _, bad := range []struct {
		c dlock.Config
		p dlock.Purpose
	}{
		{dlock.Config{}, dlock.Correctness},
		{c, dlock.Purpose("speed")},
		{dlock.Config{Correctness: "mem://x?purpose=efficiency"}, dlock.Correctness},
	} {
		if _, err := bad.c.Open(t.Context(), bad.p); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%+v.Open(%q) = %v; want ErrInvalidConfig", bad.c, bad.p, err)
		}
	}
}

// TestConfigUnset: with no URL for a purpose, opening it fails before any
// I/O with an error that names the empty field.
func TestConfigUnset(t *testing.T) {
	var c dlock.Config
	for _, p := range []dlock.Purpose{dlock.Efficiency, dlock.Correctness} {
		_, err := c.Open(t.Context(), p)
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Fatalf("Config{}.Open(%q) = %v, want ErrInvalidConfig", p, err)
		}
		if want := "Config." + strings.ToUpper(string(p[0])) + string(p[1:]) + " is empty"; !strings.Contains(err.Error(), want) {
			t.Errorf("Config{}.Open(%q) = %v, want it to say %q", p, err, want)
		}
	}
}
