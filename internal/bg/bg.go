// Package bg runs a backend driver's background goroutines (loss watchers,
// clean-ups, calls abandoned by their callers), so that the driver's Close
// can stop new ones from starting and wait for the rest.
package bg

import "sync"

// Group is a set of goroutines. The zero value is ready to use.
type Group struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// Go runs f in a goroutine of the group, unless the group is closed; it
// reports whether it did.
func (g *Group) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Go(f)
	return true
}

// Close stops Go from starting goroutines. It does not wait: see Wait.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// Wait waits for the goroutines the group started.
func (g *Group) Wait() { g.wg.Wait() }
