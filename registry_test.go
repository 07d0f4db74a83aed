package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
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

func TestRegisterLockerPanics(t *testing.T) {
	var nilOpener *memory.URLOpener
	for name, fn := range map[string]func(){
		"nil opener":         func() { new(driver.URLMux).RegisterLocker("x", nil) },
		"nil pointer opener": func() { new(driver.URLMux).RegisterLocker("x", nilOpener) },
		"empty scheme":       func() { new(driver.URLMux).RegisterLocker("", &memory.URLOpener{}) },
		"duplicate scheme":   func() { driver.DefaultURLMux().RegisterLocker("MEM", &memory.URLOpener{}) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("RegisterLocker did not panic")
				}
			}()
			fn()
		})
	}
}

func TestURLMuxSchemes(t *testing.T) {
	var m driver.URLMux
	if m.ValidLockerScheme("mem") || len(m.LockerSchemes()) != 0 {
		t.Fatalf("an empty mux knows schemes: %v", m.LockerSchemes())
	}
	m.RegisterLocker("Mine", &memory.URLOpener{})
	m.RegisterLocker("b", &memory.URLOpener{})
	if !m.ValidLockerScheme("mine") || !m.ValidLockerScheme("MINE") || m.ValidLockerScheme("mem") {
		t.Errorf("ValidLockerScheme: want mine (any case), not mem")
	}
	if got := m.LockerSchemes(); !slices.Equal(got, []string{"b", "mine"}) {
		t.Errorf("LockerSchemes() = %v; want [b mine]", got)
	}
	if !driver.DefaultURLMux().ValidLockerScheme("mem") {
		t.Errorf("the default mux lacks mem (registered by package memory's init)")
	}
	_, err := m.OpenLocker(t.Context(), "mem://")
	var oe *dlock.OpError
	if !errors.Is(err, dlock.ErrInvalidConfig) || !errors.As(err, &oe) || oe.Op != "open" {
		t.Fatalf("OpenLocker of a scheme the mux lacks: %v; want an open *OpError matching ErrInvalidConfig", err)
	}
	for _, want := range []string{`"mem"`, "registered: b, mine", "forgotten import?"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	l, err := m.OpenLocker(t.Context(), "mine://x?ttl=2s")
	if err != nil {
		t.Fatalf("OpenLocker: %v", err)
	}
	_ = l.Close()
}

// recordingOpener counts its opens and returns Lockers of the in-process
// backend that report guarantees g.
type recordingOpener struct {
	g      dlock.Guarantees
	opens  int
	got    *url.URL
	closed bool
}

func (o *recordingOpener) OpenLockerURL(_ context.Context, u *url.URL) (*dlock.Locker, error) {
	o.opens++
	o.got = u
	lo, rest, err := driver.OptionsFromURL(u, nil)
	if err != nil {
		return nil, err
	}
	if rest.RawQuery != "" {
		return nil, fmt.Errorf("%w: unknown parameters %s", dlock.ErrInvalidConfig, rest.RawQuery)
	}
	return driver.New(&guaranteesDriver{Driver: memory.NewDriver(memory.NewStore()), g: o.g, closed: &o.closed}, lo)
}

type declaringOpener struct{ *recordingOpener }

func (o declaringOpener) Guarantees() dlock.Guarantees { return o.g }

type guaranteesDriver struct {
	backend.Driver
	g      dlock.Guarantees
	closed *bool
}

func (d *guaranteesDriver) Guarantees() backend.Guarantees { return d.g }
func (d *guaranteesDriver) Close() error {
	*d.closed = true
	return d.Driver.Close()
}

func TestURLMuxPurpose(t *testing.T) {
	weak := dlock.Guarantees{Fencing: dlock.FencingBestEffort, ClockDependent: true, Notes: "test"}
	var m driver.URLMux
	declared := &recordingOpener{g: weak}
	undeclared := &recordingOpener{g: weak}
	m.RegisterLocker("declared", declaredOpener(declared))
	m.RegisterLocker("undeclared", undeclared)

	// A declared scheme is refused before the opener is called.
	if _, err := m.OpenLocker(t.Context(), "declared://x?purpose=correctness"); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("correctness on a declared weak scheme: %v; want ErrInvalidConfig", err)
	}
	if declared.opens != 0 {
		t.Errorf("the declared opener was called %d times for a purpose it cannot serve; want 0 (before any I/O)", declared.opens)
	}
	// An undeclared one is opened, found wanting, and closed.
	if _, err := m.OpenLocker(t.Context(), "undeclared://x?purpose=correctness"); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("correctness on an undeclared weak scheme: %v; want ErrInvalidConfig", err)
	}
	if undeclared.opens != 1 || !undeclared.closed {
		t.Errorf("undeclared opener: %d opens, closed %v; want 1 open, closed", undeclared.opens, undeclared.closed)
	}
	// The override opens it; the opener sees neither mux parameter.
	l, err := m.OpenLocker(t.Context(), "declared://x?purpose=correctness&unsafe_accept_clock_dependent_lock=true&ttl=3s")
	if err != nil {
		t.Fatalf("with the override: %v", err)
	}
	_ = l.Close()
	if q := declared.got.Query(); len(q) != 1 || q.Get("ttl") != "3s" {
		t.Errorf("the opener got the query %q; want ttl=3s only", declared.got.RawQuery)
	}
	// Malformed query pairs are an error, not dropped.
	for _, bad := range []string{"declared://x?ttl=1s;purpose=correctness", "declared://x?a=%zz"} {
		if _, err := m.OpenLocker(t.Context(), bad); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("OpenLocker(%q) = %v; want ErrInvalidConfig", bad, err)
		}
	}
}

func declaredOpener(o *recordingOpener) driver.URLOpener { return declaringOpener{o} }

func TestOptionsFromURL(t *testing.T) {
	u, _ := url.Parse("x://h/p?ttl=2s&other=1")
	log := slog.New(slog.DiscardHandler)
	o, rest, err := driver.OptionsFromURL(u, &dlock.Options{TTL: time.Minute, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if o.TTL != 2*time.Second || o.Logger != log {
		t.Errorf("Options %+v; want the URL's TTL 2s over the base's, the base's Logger", o)
	}
	if rest.RawQuery != "other=1" || rest.Host != "h" || rest.Path != "/p" {
		t.Errorf("rest = %s; want x://h/p?other=1", rest)
	}
	for _, bad := range []struct {
		raw  string
		base *dlock.Options
	}{
		{"x://?ttl=0s", nil}, {"x://?ttl=1ms", nil}, {"x://?ttl=", nil}, {"x://?ttl=1s&ttl=2s", nil},
		{"x://?ttl=1s;a=b", nil}, {"x://", &dlock.Options{RetryMin: -1}}, {"x://", &dlock.Options{DriftFactor: math.NaN()}},
	} {
		u, _ := url.Parse(bad.raw)
		if _, _, err := driver.OptionsFromURL(u, bad.base); !errors.Is(err, dlock.ErrInvalidConfig) && !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Errorf("OptionsFromURL(%q, %+v) = %v; want ErrInvalidConfig or ErrInvalidTTL", bad.raw, bad.base, err)
		}
	}
}

func TestBuild(t *testing.T) {
	calls := 0
	mk := func() (backend.Driver, error) {
		calls++
		return memory.NewDriver(memory.NewStore()), nil
	}
	for name, o := range map[string]dlock.Options{
		"negative retry":           {RetryMin: -time.Millisecond},
		"TTL below static floor":   {TTL: 500 * time.Millisecond},
		"TTL above static ceiling": {TTL: time.Hour},
	} {
		if _, err := driver.Build(&o, dlock.Limits{MinTTL: time.Second, MaxTTL: time.Minute}, mk); err == nil {
			t.Errorf("%s: Build accepted %+v", name, o)
		}
	}
	if calls != 0 {
		t.Errorf("Build made %d drivers for bad Options; want none (no I/O)", calls)
	}
	// A TTL the driver's own limits refuse: the driver is closed.
	closed := false
	_, err := driver.Build(&dlock.Options{TTL: 5 * time.Second}, dlock.Limits{}, func() (backend.Driver, error) {
		return &limitedDriver{Driver: memory.NewDriver(memory.NewStore()), closed: &closed}, nil
	})
	if !errors.Is(err, dlock.ErrInvalidTTL) || !closed {
		t.Errorf("Build over a driver whose limits refuse the TTL: %v, driver closed %v; want ErrInvalidTTL, closed", err, closed)
	}
	l, err := driver.Build(nil, dlock.Limits{}, mk)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
}

type limitedDriver struct {
	backend.Driver
	closed *bool
}

func (d *limitedDriver) Limits() backend.Limits { return backend.Limits{MaxTTL: time.Second} }
func (d *limitedDriver) Close() error {
	*d.closed = true
	return d.Driver.Close()
}

func TestOpenWithOwnStore(t *testing.T) {
	store := memory.NewStore()
	var m driver.URLMux
	m.RegisterLocker("mem", &memory.URLOpener{Store: store, Options: dlock.Options{TTL: 2 * time.Second}})
	l, err := m.OpenLocker(t.Context(), "mem://ignored")
	if err != nil {
		t.Fatal(err)
	}
	le, err := l.TryAcquire(t.Context(), "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if le.TTL() != 2*time.Second {
		t.Errorf("TTL %v; want the opener's Options.TTL 2s", le.TTL())
	}
	if !store.Held("k") {
		t.Errorf("the lock is not in the opener's Store")
	}
	_ = l.Close()
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
		"drift factor NaN": {DriftFactor: math.NaN()},
		"negative drift":   {DriftFactor: -0.1},
	} {
		t.Run(name, func(t *testing.T) {
			l, err := memory.New(memory.NewStore(), &o)
			if l != nil || (!errors.Is(err, dlock.ErrInvalidConfig) && !errors.Is(err, dlock.ErrInvalidTTL)) {
				t.Errorf("memory.New with Options %+v = %v, %v; want no Locker, ErrInvalidConfig or ErrInvalidTTL", o, l, err)
			}
			l, err = driver.New(memory.NewDriver(memory.NewStore()), &o)
			if l != nil || (!errors.Is(err, dlock.ErrInvalidConfig) && !errors.Is(err, dlock.ErrInvalidTTL)) {
				t.Errorf("driver.New with Options %+v = %v, %v; want no Locker, ErrInvalidConfig or ErrInvalidTTL", o, l, err)
			}
		})
	}
}

// mustNew is driver.New for tests whose Options are valid.
func mustNew(t testing.TB, d backend.Driver, opts *dlock.Options) *dlock.Locker {
	t.Helper()
	l, err := driver.New(d, opts)
	if err != nil {
		t.Fatalf("driver.New: %v", err)
	}
	return l
}

// mustMem is memory.New for tests whose Options are valid.
func mustMem(t testing.TB, s *memory.Store, opts *dlock.Options) *dlock.Locker {
	t.Helper()
	l, err := memory.New(s, opts)
	if err != nil {
		t.Fatalf("memory.New: %v", err)
	}
	return l
}

// TestOpenBadURLHidesPassword: a URL that does not parse is refused
// (ErrInvalidConfig) with its scheme and the kind of problem, never its
// text: Go's url.Parse errors quote the URL or a part of it, which may be
// the password (issue 21, finding 3).
func TestOpenBadURLHidesPassword(t *testing.T) {
	for _, tc := range []struct {
		raw, secret, want string
	}{
		// A bad %-escape in the password: url.Error quotes the whole URL.
		{"redis://app:p%zzSECRET@localhost:6379", "SECRET", `a "redis" URL`},
		// A '/' in the password ends the host: "invalid port \":S3cr\" after host".
		{"redis://app:S3cr/et@localhost:6379", "S3cr", `a "redis" URL`},
		{"etcd://app:S3cr#et@localhost:2379", "S3cr", `a "etcd" URL`},
		{"zk://app:S3cr?et@localhost:2181", "S3cr", `a "zk" URL`},
		// A control character; no valid scheme.
		{"redis://app:S3cret\x7f@localhost:6379", "S3cret", `a "redis" URL`},
		{"1redis://app:S3cr/et@localhost", "S3cr", "a URL without a valid scheme"},
	} {
		if _, err := url.Parse(tc.raw); err == nil {
			t.Fatalf("url.Parse(%q) succeeds: not a test of a bad URL", tc.raw)
		}
		_, err := dlock.Open(t.Context(), tc.raw)
		_, cerr := dlock.Config{Correctness: tc.raw}.Open(t.Context(), dlock.Correctness)
		for _, err := range []error{err, cerr} {
			if !errors.Is(err, dlock.ErrInvalidConfig) {
				t.Errorf("Open(%q): %v, want ErrInvalidConfig", tc.raw, err)
				continue
			}
			msg := err.Error()
			if strings.Contains(msg, tc.secret) {
				t.Errorf("Open(%q): error %q shows the password (%q)", tc.raw, msg, tc.secret)
			}
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, "does not parse") {
				t.Errorf("Open(%q): error %q, want it to name %s that does not parse", tc.raw, msg, tc.want)
			}
		}
	}
}

// TestOpenAtAfterHostHidesPassword: a URL that parses, but with no user
// and an '@' after its host, is a password holding an unescaped '/', '?'
// or '#' ("redis://app:2024/S3cret@host": host "app:2024", the password in
// the path). Open refuses it (ErrInvalidConfig) before any I/O without
// showing its text; an '@' written %40 is fine.
func TestOpenAtAfterHostHidesPassword(t *testing.T) {
	for _, raw := range []string{
		"redis://app:2024/S3cret@localhost:6379",
		"etcd://app:2024#S3cret@localhost:2379",
		"zk://app:2024?S3cret@localhost:2181",
		"mem://x/y?z=S3cret@",
	} {
		if u, err := url.Parse(raw); err != nil || u.User != nil {
			t.Fatalf("url.Parse(%q) = %v, %v: not a URL that parses without a user", raw, u, err)
		}
		_, err := dlock.Open(t.Context(), raw)
		_, cerr := dlock.Config{Efficiency: raw}.Open(t.Context(), dlock.Efficiency)
		for _, err := range []error{err, cerr} {
			if !errors.Is(err, dlock.ErrInvalidConfig) {
				t.Errorf("Open(%q): %v, want ErrInvalidConfig", raw, err)
				continue
			}
			if msg := err.Error(); strings.Contains(msg, "S3cret") || !strings.Contains(msg, "escaped") {
				t.Errorf("Open(%q): error %q shows the password or does not say to escape it", raw, msg)
			}
		}
	}
	l, err := dlock.Open(t.Context(), "mem://x#a%40b")
	if err != nil {
		t.Fatalf("Open of a URL with %%40 in its fragment: %v", err)
	}
	_ = l.Close()
}
