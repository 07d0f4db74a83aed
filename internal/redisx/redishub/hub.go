// Package redishub wakes Redis lock waiters: it multiplexes the release
// channels of watched lock keys over one go-redis PubSub per client. The
// redis backend uses one Hub; the redlock backend one per node.
package redishub

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

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
// subscribed on the connection that delivers it (the key's channel is in
// the SUBSCRIBE of every Watch until the server has confirmed it, as a
// failed SUBSCRIBE's channels are not re-subscribed). The barrier is then
// unsubscribed. (Matching the key channel's own confirmation would not do:
// after an UNSUBSCRIBE and a new SUBSCRIBE of the same channel, a late
// confirmation of the old SUBSCRIBE could be taken for the new one.)
//
// Commands: the SUBSCRIBE and UNSUBSCRIBE commands are sent by one goroutine
// of the Hub, in the order the watcher counts changed, each with a context
// of opTimeout (a SUBSCRIBE its caller's deadline when that is later), so
// that no caller waits for them beyond its own context: a go-redis PubSub
// command may have to make the connection first (dial and handshake, a few
// round trips), and it waits for the PubSub's lock, which the PubSub's
// receiving goroutine holds while it re-makes the connection with no
// deadline of ours. That wait ignores contexts: over a dead link a command
// (and the ones queued behind it) can take the handshake's round trips
// times the client's ReadTimeout (about 9s with go-redis's defaults), and
// so can Close, which needs the same lock. Watch waits for its SUBSCRIBE and the confirmation until
// its context ends, or until checks find that the server answers the
// SUBSCRIBE with an error or never confirms it (see confirm: go-redis
// drops error replies, so the confirmation never comes); the clean-ups (the barrier's UNSUBSCRIBE, and that of a
// channel whose last watcher stopped) are not waited for. A clean-up that
// fails leaves no subscription behind: go-redis drops the channel from the
// set it re-subscribes before it writes the UNSUBSCRIBE, and a failed write
// (or one whose deadline passed) closes the connection, which ends its
// subscriptions on the server.
//
// Reconnects: go-redis re-subscribes after a reconnect; a confirmation of a
// key channel that was already confirmed therefore means messages may have
// been lost in between, and wakes that channel's watchers (a spurious
// wake-up, which Waiter allows).
type Hub struct {
	client goredis.UniversalClient
	name   string // for errors: "redis", "redlock node 1 (h:6379)"

	mu       sync.Mutex
	closed   bool
	ps       *goredis.PubSub
	done     chan struct{} // closed when dispatch has returned
	chans    map[string]*watchedChan
	barriers map[string]chan struct{}
	seq      uint64
	barrier  string // prefix of this hub's barrier channels

	ops      []op          // commands for the sender, in order
	kick     chan struct{} // a value when ops were added or the Hub closed
	sendDone chan struct{} // closed when send has returned
}

// opTimeout is the context of each SUBSCRIBE or UNSUBSCRIBE the Hub sends
// (a SUBSCRIBE gets its caller's deadline instead when that is later); it
// does not bound a wait for the PubSub's lock (see Hub). On a healthy
// link such a command is one write on the open connection, well under a
// millisecond; making the connection again costs a dial and the
// handshake, a few round trips, milliseconds on a LAN. 2s leaves room for
// a slow link without holding the sender (and the commands queued behind
// it) long over a dead one. Callers never wait for it beyond their own
// context.
const opTimeout = 2 * time.Second

// op is one command for the sender: SUBSCRIBE (sub) or UNSUBSCRIBE of
// chans. res, if not nil, receives the outcome (it has room for it).
type op struct {
	ctx   context.Context
	sub   bool
	chans []string
	res   chan error
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
// unsubscribed when its last watcher stops. stop must be called once; it
// does not wait for the UNSUBSCRIBE to be sent. When ctx ends first, Watch
// returns at once with an error that matches backend.ErrUnavailable and
// ctx.Err(), and its subscription is undone in the background. When the
// server answers the SUBSCRIBE with an error (NOPERM: the user may not use
// the channel or the command; BUSY), Watch returns an error that matches
// backend.ErrUnavailable and wraps the server's reply (a goredis.Error),
// once a check on a connection of its own has read it (see confirm): a
// quarter of a second or so after the SUBSCRIBE; when two checks find it
// allowed but no confirmation has come, after about a second, an error
// that matches backend.ErrUnavailable.
func (h *Hub) Watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	w := make(chan struct{}, 1)

	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, backend.ErrClosed
	}
	if h.ps == nil {
		h.ps = h.client.Subscribe(context.WithoutCancel(ctx))
		h.done = make(chan struct{})
		h.kick = make(chan struct{}, 1)
		h.sendDone = make(chan struct{})
		go h.dispatch(h.ps.ChannelWithSubscriptions(), h.done)
		go h.send(h.ps)
	}
	done := h.done
	wc := h.chans[channel]
	if wc == nil {
		wc = &watchedChan{watchers: map[chan struct{}]struct{}{}}
		h.chans[channel] = wc
	}
	wc.watchers[w] = struct{}{}
	h.seq++
	barrier := h.barrier + strconv.FormatUint(h.seq, 10)
	confirmed := make(chan struct{})
	h.barriers[barrier] = confirmed
	// The key's channel goes in every SUBSCRIBE until the server has
	// confirmed it: an earlier watcher's SUBSCRIBE may fail, and go-redis
	// does not re-subscribe the channels of a SUBSCRIBE whose write failed
	// (it adds them to its set only after the write). A second
	// confirmation is a spurious wake-up at worst.
	subs := []string{barrier}
	if !wc.confirmed {
		subs = []string{channel, barrier}
	}
	// Queued under h.mu so that the SUBSCRIBE and UNSUBSCRIBE commands of
	// one channel reach the server in the order of the watcher count's
	// transitions.
	res := make(chan error, 1)
	h.enqueue(op{ctx: ctx, sub: true, chans: subs, res: res})
	h.mu.Unlock()

	stop := h.stopper(channel, wc, w)
	var err error
	select {
	case err = <-res:
		if err == nil {
			err = h.confirm(ctx, confirmed, done, subs)
		}
	case <-ctx.Done():
		err = ctx.Err()
	case <-done:
		err = backend.ErrClosed
	}

	h.mu.Lock()
	delete(h.barriers, barrier)
	if !h.closed {
		h.enqueue(op{sub: false, chans: []string{barrier}})
	}
	h.mu.Unlock()

	if err != nil {
		stop()
		if err == backend.ErrClosed {
			return nil, nil, backend.ErrClosed
		}
		var re goredis.Error
		if errors.As(err, &re) {
			return nil, nil, fmt.Errorf("%w: %s: the server answered SUBSCRIBE %q with an error (go-redis drops this reply; "+
				"a check on a connection of its own read it): %w", backend.ErrUnavailable, h.name, subs, err)
		}
		return nil, nil, fmt.Errorf("%w: %s: subscribing to %q: %w", backend.ErrUnavailable, h.name, channel, err)
	}
	return w, stop, nil
}

// Waiting for a SUBSCRIBE's confirmation: the check of a refusal comes
// checkAfter after the SUBSCRIBE was written (a confirmation takes a round
// trip, well under a millisecond on a LAN, so a check is rare and costs
// only a connection), and once more after twice as long if the first found
// nothing wrong; if the confirmation has still not come then, Watch fails
// (errUnconfirmed) and the waiter polls.
const checkAfter = 250 * time.Millisecond

// errUnconfirmed: the server allows the SUBSCRIBE (two checks said so) but
// its confirmation has not come. go-redis drops every error reply on the
// PubSub's connection, not only refusals: a SUBSCRIBE answered -BUSY while
// a script ran too long is never confirmed either, and waiting for it would
// end only with the caller's context.
var errUnconfirmed = errors.New("no confirmation of the SUBSCRIBE, although the server allows it (an error reply that go-redis dropped?)")

// confirm waits for the barrier's confirmation (confirmed closed), ctx or
// the Hub's end (done closed). The server answers a SUBSCRIBE it refuses
// (an ACL user without the right to the channels, NOPERM) or cannot serve
// now (BUSY) with an error reply, which go-redis's PubSub channel drops
// (its receiving loop skips every error of Receive), so no confirmation
// would ever come and the wait would end only with ctx. confirm therefore
// checks, when the confirmation is late, whether the server refuses this
// very SUBSCRIBE, on a connection of its own (CheckSubscribe), and returns
// the server's error if so; after two checks that find nothing wrong it
// returns errUnconfirmed. Either way Watch fails, and the dlock layer
// waits by polling instead (it logs a warning). A check that fails for
// another reason (the network) counts as neither: the PubSub
// re-subscribes once its connection is back. The confirmation, ctx and
// the Hub's end are watched during a check too.
func (h *Hub) confirm(ctx context.Context, confirmed, done <-chan struct{}, subs []string) error {
	wait := checkAfter
	t := time.NewTimer(wait)
	defer t.Stop()
	clean := 0 // checks that found the SUBSCRIBE allowed
	var checked chan error
	// A check still under way when confirm returns is ended (its
	// connection closed) and waited for: no goroutine outlives Watch.
	var running sync.WaitGroup
	defer running.Wait()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for {
		select {
		case <-confirmed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return backend.ErrClosed
		case <-t.C:
			ch := make(chan error, 1) // buffered: the check never blocks on us
			checked = ch
			running.Go(func() {
				ctx, cancel := context.WithTimeout(cctx, opTimeout)
				defer cancel()
				ch <- checkSubscribe(ctx, h.client, subs...)
			})
			continue
		case err := <-checked:
			checked = nil
			var re goredis.Error
			switch {
			case errors.As(err, &re):
				return err
			case err == nil:
				if clean++; clean == 2 {
					return errUnconfirmed
				}
			}
			wait *= 2
			t.Reset(wait)
		}
	}
}

// CheckSubscribe reports whether the server lets this client subscribe to
// channel (and to a barrier channel of the Hub's, which every Watch
// subscribes to as well) and unsubscribe again, on a connection of its own
// that it reads itself: go-redis's PubSub, which the Hub reads through its
// channel, drops error replies, so a Watch refused by the user's ACL could
// not tell. It returns the server's error reply (a goredis.Error: NOPERM
// for a channel or a command the user may not use), another error when the
// check could not be made (the network; it gives up after opTimeout), or
// nil. It costs a dial and handshake and two round trips; on a Cluster it
// asks the node serving channel's slot.
func (h *Hub) CheckSubscribe(ctx context.Context, channel string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return checkSubscribe(ctx, h.client, channel, h.barrier+"check")
}

// checkSubscribe is CheckSubscribe of chans, within ctx.
func checkSubscribe(ctx context.Context, client goredis.UniversalClient, chans ...string) error {
	ps := client.Subscribe(ctx) // no channels: no connection yet
	// go-redis's reads follow ctx's deadline but not its cancellation:
	// closing the connection ends a read at once.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer func() {
		stop()
		_ = ps.Close()
	}()
	if err := ps.Subscribe(ctx, chans...); err != nil {
		return err
	}
	if err := receive(ctx, ps, "subscribe", len(chans)); err != nil {
		return err
	}
	if err := ps.Unsubscribe(ctx, chans...); err != nil {
		return err
	}
	return receive(ctx, ps, "unsubscribe", len(chans))
}

// receive reads ps until n confirmations of kind have come, or an error
// (an error reply of the server is one).
func receive(ctx context.Context, ps *goredis.PubSub, kind string, n int) error {
	for n > 0 {
		m, err := ps.Receive(ctx)
		if err != nil {
			return err
		}
		if s, ok := m.(*goredis.Subscription); ok && s.Kind == kind {
			n--
		}
	}
	return nil
}

// enqueue adds o to the sender's queue. h.mu is held and the Hub is open.
func (h *Hub) enqueue(o op) {
	h.ops = append(h.ops, o)
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// send sends the queued commands on ps, in order, until the Hub is closed.
func (h *Hub) send(ps *goredis.PubSub) {
	defer close(h.sendDone)
	for {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return
		}
		if len(h.ops) == 0 {
			h.mu.Unlock()
			<-h.kick
			continue
		}
		o := h.ops[0]
		h.ops[0] = op{}
		h.ops = h.ops[1:]
		h.mu.Unlock()

		var err error
		if o.sub {
			// The caller's values, not its cancellation: a SUBSCRIBE cut
			// short by the caller's context would make go-redis close the
			// connection every watcher shares.
			d := time.Now().Add(opTimeout)
			if cd, ok := o.ctx.Deadline(); ok && cd.After(d) {
				d = cd
			}
			ctx, cancel := context.WithDeadline(context.WithoutCancel(o.ctx), d)
			err = ps.Subscribe(ctx, o.chans...)
			cancel()
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			err = ps.Unsubscribe(ctx, o.chans...)
			cancel()
		}
		if o.res != nil {
			o.res <- err
		}
	}
}

// stopper returns the stop function of one watcher.
func (h *Hub) stopper(channel string, wc *watchedChan, w chan struct{}) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			delete(wc.watchers, w)
			if len(wc.watchers) == 0 && h.chans[channel] == wc {
				delete(h.chans, channel)
				if !h.closed {
					h.enqueue(op{sub: false, chans: []string{channel}})
				}
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

// Close closes the PubSub and waits for the dispatcher and the sender to
// finish (commands still queued are dropped: closing the PubSub ends its
// subscriptions); every watcher's wake channel is closed. Later Watches
// return backend.ErrClosed. Over a dead link Close can wait as long as the
// PubSub's reconnect (see Hub), as it did before the sender existed.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	h.ops = nil
	ps, done, sendDone := h.ps, h.done, h.sendDone
	if ps != nil {
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}
	h.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
		<-done
		<-sendDone
	}
}
