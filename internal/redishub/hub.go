// Package redishub wakes Redis lock waiters: it multiplexes the release
// channels of watched lock keys over one go-redis PubSub per client. The
// redis backend uses one Hub; the redlock backend one per node.
package redishub

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
)

// Hub multiplexes the release channels of all watched keys over one go-redis
// PubSub per client, created on the first Watch.
//
// Confirmation: Watch must not return before the server has the
// subscription in force. Every Watch subscribes, in the same SUBSCRIBE
// command as the key's channel (or after it), to a throw-away "barrier"
// channel unique to that call, and waits for the server's confirmation of
// the barrier. Replies on one connection arrive in command order, and a
// reconnecting PubSub re-subscribes all its channels before sending
// anything else, so the barrier's confirmation proves the key's channel is
// subscribed on the connection that delivers it. The barrier is then
// unsubscribed. (Matching the key channel's own confirmation would not do:
// after an UNSUBSCRIBE and a new SUBSCRIBE of the same channel, a late
// confirmation of the old SUBSCRIBE could be taken for the new one.)
//
// Reconnects: go-redis re-subscribes after a reconnect; a confirmation of a
// key channel that was already confirmed therefore means messages may have
// been lost in between, and wakes that channel's watchers (a spurious
// wake-up, which Waiter allows).
type Hub struct {
	client goredis.UniversalClient
	name   string // for errors: "redis", "redlock node 1 (h:6379)"

	// subMu orders the SUBSCRIBE and UNSUBSCRIBE writes the way the
	// watcher counts change, without holding mu (which dispatch needs
	// for every message) across network I/O. Taken before mu.
	subMu sync.Mutex

	mu       sync.Mutex
	closed   bool
	ps       *goredis.PubSub
	done     chan struct{} // closed when dispatch has returned
	chans    map[string]*watchedChan
	barriers map[string]chan struct{}
	seq      uint64
	barrier  string // prefix of this hub's barrier channels
}

// watchedChan is one subscribed release channel and its local watchers.
type watchedChan struct {
	confirmed bool
	watchers  map[chan struct{}]struct{}
}

// New returns a Hub over client, which stays the caller's: the Hub closes
// only the PubSub it makes. barrier is the prefix of the Hub's throw-away
// barrier channels, unique to it (for example the key prefix, "barrier:"
// and a random string); name is put before its errors.
func New(client goredis.UniversalClient, barrier, name string) *Hub {
	return &Hub{
		client:   client,
		name:     name,
		chans:    map[string]*watchedChan{},
		barriers: map[string]chan struct{}{},
		barrier:  barrier,
	}
}

// Watch subscribes to channel and returns once the subscription is
// confirmed by the server, so that a message published after Watch returns
// is reported on wake. wake receives a value on every message on channel
// (and, spuriously, after a pub/sub reconnect); it is closed when the Hub is
// closed. All watchers of a Hub share one pub/sub connection; a channel is
// unsubscribed when its last watcher stops. stop must be called once.
func (h *Hub) Watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	w := make(chan struct{}, 1)

	h.subMu.Lock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.subMu.Unlock()
		return nil, nil, backend.ErrClosed
	}
	if h.ps == nil {
		h.ps = h.client.Subscribe(context.WithoutCancel(ctx))
		h.done = make(chan struct{})
		go h.dispatch(h.ps.ChannelWithSubscriptions(), h.done)
	}
	ps, done := h.ps, h.done
	wc := h.chans[channel]
	first := wc == nil
	if first {
		wc = &watchedChan{watchers: map[chan struct{}]struct{}{}}
		h.chans[channel] = wc
	}
	wc.watchers[w] = struct{}{}
	h.seq++
	barrier := h.barrier + strconv.FormatUint(h.seq, 10)
	confirmed := make(chan struct{})
	h.barriers[barrier] = confirmed
	subs := []string{barrier}
	if first {
		subs = []string{channel, barrier}
	}
	h.mu.Unlock()
	// Sent under h.subMu so that SUBSCRIBE and UNSUBSCRIBE of one channel
	// reach the server in the order of the watcher count's transitions.
	subErr := ps.Subscribe(ctx, subs...)
	h.subMu.Unlock()

	stop := h.stopper(channel, wc, w)
	if subErr == nil {
		select {
		case <-confirmed:
		case <-ctx.Done():
			subErr = ctx.Err()
		case <-done:
			subErr = backend.ErrClosed
		}
	}

	h.subMu.Lock()
	h.mu.Lock()
	delete(h.barriers, barrier)
	closed := h.closed
	h.mu.Unlock()
	if !closed {
		_ = ps.Unsubscribe(context.WithoutCancel(ctx), barrier)
	}
	h.subMu.Unlock()

	if subErr != nil {
		stop()
		if subErr == backend.ErrClosed {
			return nil, nil, subErr
		}
		return nil, nil, fmt.Errorf("%w: %s: subscribing to %q: %w", backend.ErrUnavailable, h.name, channel, subErr)
	}
	return w, stop, nil
}

// stopper returns the stop function of one watcher.
func (h *Hub) stopper(channel string, wc *watchedChan, w chan struct{}) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			h.subMu.Lock()
			defer h.subMu.Unlock()
			h.mu.Lock()
			delete(wc.watchers, w)
			last := len(wc.watchers) == 0 && h.chans[channel] == wc
			if last {
				delete(h.chans, channel)
			}
			closed, ps := h.closed, h.ps
			h.mu.Unlock()
			if last && !closed {
				_ = ps.Unsubscribe(context.Background(), channel)
			}
		})
	}
}

// dispatch fans the PubSub's messages out to the watchers until the PubSub
// is closed, then closes every remaining watcher's channel.
func (h *Hub) dispatch(msgs <-chan any, done chan struct{}) {
	defer close(done)
	for m := range msgs {
		h.mu.Lock()
		switch m := m.(type) {
		case *goredis.Message:
			if wc := h.chans[m.Channel]; wc != nil {
				wakeAll(wc)
			}
		case *goredis.Subscription:
			if m.Kind != "subscribe" {
				break
			}
			if c, ok := h.barriers[m.Channel]; ok {
				close(c)
				delete(h.barriers, m.Channel)
			} else if wc := h.chans[m.Channel]; wc != nil {
				if wc.confirmed {
					wakeAll(wc) // re-subscribed after a reconnect: a release may have been missed
				}
				wc.confirmed = true
			}
		}
		h.mu.Unlock()
	}
	h.mu.Lock()
	for _, wc := range h.chans {
		for w := range wc.watchers {
			close(w)
		}
		wc.watchers = map[chan struct{}]struct{}{}
	}
	h.mu.Unlock()
}

func wakeAll(wc *watchedChan) {
	for w := range wc.watchers {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// Close closes the PubSub and waits for the dispatcher to finish; every
// watcher's wake channel is closed. Later Watches return backend.ErrClosed.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	ps, done := h.ps, h.done
	h.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
		<-done
	}
}
