package redis

import (
	"context"

	"github.com/dlock-go/dlock/internal/redisx/redishub"
)

// hub multiplexes the release channels of all watched keys over one go-redis
// PubSub per Driver, created on the first Watch (see internal/redisx/redishub for
// how a subscription is confirmed and what a reconnect does; the redlock
// backend uses the same code, one Hub per node).
type hub struct {
	h *redishub.Hub
}

func (h *hub) init(d *Driver) {
	h.h = redishub.New(d.client, d.prefix+"barrier:"+newValue()[:16]+":", "redis")
}

// Watch subscribes to the release channel of key and returns once the
// subscription is confirmed by the server, so that a release after Watch
// returns is reported on wake. wake receives a value on every release
// notification of key (and, spuriously, after a pub/sub reconnect); it is
// closed when the Driver is closed. All watchers of a Driver share one
// pub/sub connection; a key's channel is unsubscribed when its last watcher
// stops. A SUBSCRIBE the server refuses (the user may not use the channel,
// NOPERM) fails Watch with an error wrapping [backend.ErrUnavailable] and
// the server's reply, a quarter of a second or so after it was sent (see
// the package documentation, Permissions); the Locker then polls.
func (d *Driver) Watch(ctx context.Context, key string) (wake <-chan struct{}, stop func(), err error) {
	return d.hub.h.Watch(ctx, d.lockKey(key)+releaseSuffix)
}

// close closes the PubSub and waits for the dispatcher to finish.
func (h *hub) close() { h.h.Close() }
