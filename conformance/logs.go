package conformance

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/dlock-go/dlock"
)

// LogRecorder is a slog.Handler that keeps every record it is given, for
// tests of what a Locker and its backend log: give slog.New(r) as
// dlock.Options.Logger. It is safe for concurrent use.
type LogRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

// Enabled reports true: every level is recorded.
func (r *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle records rec.
func (r *LogRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// WithAttrs returns r: attributes are not recorded.
func (r *LogRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }

// WithGroup returns r: groups are not recorded.
func (r *LogRecorder) WithGroup(string) slog.Handler { return r }

// Above returns the messages of the records above level, each prefixed with
// its level.
func (r *LogRecorder) Above(level slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs {
		if rec.Level > level {
			out = append(out, rec.Level.String()+" "+rec.Message)
		}
	}
	return out
}

// Contains reports whether a record's message, at any level, contains s.
func (r *LogRecorder) Contains(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if strings.Contains(rec.Message, s) {
			return true
		}
	}
	return false
}

// quietClose: a Locker used normally (a lease released, one held with
// AutoRefresh, a TryAcquire refused) logs nothing above Debug, Close
// included.
func (s *suite) quietClose(t *testing.T) {
	rec := &LogRecorder{}
	l, err := s.h.NewLocker(t.Context(), &dlock.Options{Logger: slog.New(rec)})
	if err != nil {
		t.Fatalf("NewLocker: %v", err)
	}
	other := s.locker(t)
	k1, k2 := key(t)+"/1", key(t)+"/2"
	le, err := l.Acquire(t.Context(), k1, nil)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := l.Acquire(t.Context(), k2, &dlock.AcquireOptions{AutoRefresh: true}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := other.TryAcquire(t.Context(), k2, nil); err == nil {
		t.Fatalf("TryAcquire of a held key succeeded")
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := rec.Above(slog.LevelDebug); len(got) > 0 {
		t.Errorf("normal use and Close logged above Debug:\n%s", strings.Join(got, "\n"))
	}
}
