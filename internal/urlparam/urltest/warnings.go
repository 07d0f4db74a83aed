package urltest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// Warnings is a slog.Handler that keeps the messages of the records at
// Warn level or above, for the tests of the warnings a backend logs (a
// password sent in clear text, skip_verify=true): slog.New(w) is the
// Logger to give the backend.
type Warnings struct {
	mu   sync.Mutex
	msgs []string
}

// Enabled reports whether l is Warn or above.
func (w *Warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

// Handle keeps rec's message.
func (w *Warnings) Handle(_ context.Context, rec slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, rec.Message)
	return nil
}

// WithAttrs returns w: attributes are not kept.
func (w *Warnings) WithAttrs([]slog.Attr) slog.Handler { return w }

// WithGroup returns w: groups are not kept.
func (w *Warnings) WithGroup(string) slog.Handler { return w }

// Containing returns the messages kept so far that contain s (all of them
// for "").
func (w *Warnings) Containing(s string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, m := range w.msgs {
		if strings.Contains(m, s) {
			out = append(out, m)
		}
	}
	return out
}
