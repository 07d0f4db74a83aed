package redis_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redis"
)

// New refuses bad opts.Locker before any I/O: no connection reaches the
// server.
func TestNewRejectsBadLockerOptionsBeforeIO(t *testing.T) {
	addr, accepted := recordingListener(t)
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for name, lo := range map[string]dlock.Options{
		"negative retry":  {RetryMin: -time.Millisecond},
		"TTL below floor": {TTL: time.Millisecond},
		"drift factor":    {DriftFactor: 0.7},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		l, err := redis.New(ctx, c, &redis.Options{Locker: &lo})
		cancel()
		if l != nil {
			_ = l.Close()
		}
		if !errors.Is(err, dlock.ErrInvalidConfig) && !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Errorf("%s: New = %v; want ErrInvalidConfig or ErrInvalidTTL", name, err)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections reached the server; want none (options are checked before any I/O)", n)
	}
}

// recordingListener listens on a loopback port and counts the connections
// made to it (closing each at once) until the test ends.
func recordingListener(t *testing.T) (string, *atomic.Int32) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return ln.Addr().String(), &n
}
