package servers

import (
	"context"
	"errors"
	"time"
)

// ErrNoFaketime is returned (wrapped) by [StartRedisFaketime] when the Redis
// image has no libfaketime, so that the servers' clocks cannot be moved.
var ErrNoFaketime = errors.New("servers: the Redis image has no libfaketime")

// StartRedisFaketime is [StartRedisWithArgs] for servers whose clock can
// jump: each redis-server runs under libfaketime, with its realtime clock
// (what Redis expires keys by, and answers TIME with) offset from the real
// time by [Server.ShiftClock]; the offset starts at zero. The monotonic
// clock is not faked. The offset is kept across [Server.Stop],
// [Server.Kill] and [Server.Start], as a machine's clock would be.
//
// The image must have Debian's libfaketime package installed
// (/usr/lib/<arch>/faketime/libfaketimeMT.so.1, and sh, ls, sed, tr and
// env): the Redis stand-in that scripts/test.sh builds has it, the official
// redis image does not. Without it, StartRedisFaketime returns an error
// that matches [ErrNoFaketime]. The caller owns the servers and should
// Terminate them.
func StartRedisFaketime(ctx context.Context, n int, args ...string) ([]*Server, error) {
	return startServers(ctx, "redis-faketime", n, args...)
}

// checkFaketime makes sure that libfaketime is loaded into s's server
// process: an error matching [ErrNoFaketime] if not.
func (s *Server) checkFaketime(ctx context.Context) error {
	_, err := s.do(ctx, "checkfaketime")
	return err
}

// ShiftClock sets the offset of s's realtime clock from the real time to
// d (not added to an earlier shift: ShiftClock(ctx, 0) puts the clock
// back): from when ShiftClock returns, the server's wall clock reads the
// real time plus d, so for d > 0 keys with a TTL expire d early (as after
// an NTP step or a leap of a virtual machine's clock), and for d < 0 late.
// The server keeps running; its monotonic clock is untouched. s must have
// been started by [StartRedisFaketime] and be running.
func (s *Server) ShiftClock(ctx context.Context, d time.Duration) error {
	_, err := call(ctx, request{Op: "shiftclock", Server: s.id, Nanos: int64(d)})
	return err
}
