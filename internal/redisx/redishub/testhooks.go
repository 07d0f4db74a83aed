package redishub

import "github.com/dlock-go/dlock/internal/testhook"

// The hooks below exist for the package's tests against real servers in
// tests/redishub (the development module), which cannot reach this
// package's internals. They do nothing unless a test calls them.
func init() {
	// The number of local watchers of a channel (0 if it is not watched).
	testhook.Set("redishub.Watchers", func(h *Hub, channel string) int {
		h.mu.Lock()
		defer h.mu.Unlock()
		if wc := h.chans[channel]; wc != nil {
			return len(wc.watchers)
		}
		return 0
	})
}
