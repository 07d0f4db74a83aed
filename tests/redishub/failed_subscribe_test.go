package redishub_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redisx/redishub"
	"github.com/dlock-go/dlock/tests/servers"
)

// hook makes a hookConn fail (after blocking until release) the first
// write that contains needle, once armed.
type hook struct {
	mu      sync.Mutex
	needle  []byte
	entered chan struct{}
	release chan struct{}
}

// hookConn is a connection whose writes hook can fail.
type hookConn struct {
	net.Conn
	h *hook
}

func (c hookConn) Write(b []byte) (int, error) {
	c.h.mu.Lock()
	hit := c.h.needle != nil && bytes.Contains(b, c.h.needle)
	if hit {
		c.h.needle = nil
	}
	c.h.mu.Unlock()
	if hit {
		close(c.h.entered)
		<-c.h.release
		return 0, errors.New("injected write error (as EPIPE or ECONNRESET)")
	}
	return c.Conn.Write(b)
}

// TestLostWakeAfterFailedSubscribe: watcher A's SUBSCRIBE [X, bA] fails on
// write (go-redis re-makes the connection in that call, before it adds X
// to the channels it re-subscribes); watcher B of the same channel,
// registered meanwhile, must still have X subscribed when its Watch
// returns: a release published afterwards wakes it. (Found in review:
// B sent SUBSCRIBE [bB] only, its Watch returned nil with X not
// subscribed, and the release did not wake it.)
func TestLostWakeAfterFailedSubscribe(t *testing.T) {
	addr := servers.Redis(t, 1)[0].Addr()
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	defer admin.Close()
	hk := &hook{}
	c := goredis.NewClient(&goredis.Options{Addr: addr, Dialer: func(ctx context.Context, network, a string) (net.Conn, error) {
		var d net.Dialer
		cn, err := d.DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		return hookConn{cn, hk}, nil
	}})
	defer c.Close()
	h := redishub.New(c, unique(t)+":barrier:", "test")
	defer h.Close()
	// Make the PubSub connection exist first.
	other := unique(t) + ".other"
	_, stopO, err := h.Watch(t.Context(), other)
	if err != nil {
		t.Fatal(err)
	}
	defer stopO()

	x := unique(t)
	hk.mu.Lock()
	hk.needle = []byte(x)
	hk.entered = make(chan struct{})
	hk.release = make(chan struct{})
	hk.mu.Unlock()

	aErr := make(chan error, 1)
	go func() {
		_, _, err := h.Watch(t.Context(), x)
		aErr <- err
	}()
	<-hk.entered
	type res struct {
		wake <-chan struct{}
		stop func()
		err  error
	}
	bRes := make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		w, s, err := h.Watch(ctx, x)
		bRes <- res{w, s, err}
	}()
	// Wait until B is registered as a watcher of x.
	for {
		if watchers(h, x) == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(hk.release)
	t.Logf("A: %v", <-aErr)
	b := <-bRes
	if b.err != nil {
		t.Fatalf("B's Watch: %v", b.err)
	}
	defer b.stop()
	m, _ := admin.PubSubNumSub(t.Context(), x).Result()
	t.Logf("after B's Watch returned nil: NUMSUB %s = %d", x, m[x])
	admin.Publish(t.Context(), x, "release")
	select {
	case <-b.wake:
		t.Logf("B woken")
	case <-time.After(3 * time.Second):
		t.Errorf("lost wake-up: B's Watch returned nil, a release published afterwards did not wake it (NUMSUB %d)", m[x])
	}
}
