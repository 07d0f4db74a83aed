package redis_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
)

// replyDropper is a TCP proxy to the test server that, when armed, lets the
// next EVALSHA through to the server and then cuts the connection (or, with
// hold, swallows the reply) instead of passing the reply back: the command
// took effect, the client never hears of it (a network failure, or a
// cancellation, at the worst moment).
type replyDropper struct {
	ln    net.Listener
	to    string
	armed atomic.Bool
	hold  bool // swallow the reply and keep the connection open, instead of cutting it
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newReplyDropper(t *testing.T) *replyDropper {
	t.Helper()
	return newReplyDropperTo(t, serverAddr(t))
}

// newReplyDropperTo is newReplyDropper to the server at addr.
func newReplyDropperTo(t *testing.T, addr string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{ln: ln, to: addr}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *replyDropper) Addr() string { return p.ln.Addr().String() }

func (p *replyDropper) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var drop atomic.Bool // the next reply on this connection is dropped
		p.wg.Add(2)
		go func() { // client to server
			defer p.wg.Done()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if bytes.Contains(bytes.ToLower(buf[:n]), []byte("evalsha")) && p.armed.CompareAndSwap(true, false) {
						drop.Store(true)
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server to client
			defer p.wg.Done()
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && drop.Load() {
					if p.hold {
						continue // the client waits for a reply that never comes
					}
					s.Close()
					return
				}
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// The reply to a successful acquire is lost and go-redis resends the
// script: the second run must find the lock ours and return the same token,
// not report it held by someone else (leaving an orphan until the TTL).
func TestAcquireReplyLostAndRetried(t *testing.T) {
	p := newReplyDropper(t)
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	d := newDriver(t, c, nil)
	admin := serverClient(t)
	key := uniqueKey(t)

	p.armed.Store(true)
	l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute})
	if p.armed.Load() {
		t.Fatal("the proxy never saw the acquire script")
	}
	if err != nil {
		t.Fatalf("TryAcquire whose first reply was lost = %v; want the retry to find the lock ours", err)
	}
	if counter, _ := admin.Get(t.Context(), lockKey(key)+":fence").Uint64(); l.Token() != counter {
		t.Errorf("token %d, but the counter is %d: the retry issued another token", l.Token(), counter)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := admin.Exists(t.Context(), lockKey(key)).Val(); n != 0 {
		t.Fatal("lock key left behind")
	}
}

// The reply to a successful acquire is lost and nothing resends it: the
// driver must delete the lock it may have taken, not leave it to the TTL.
func TestAcquireReplyLostCleansUp(t *testing.T) {
	p := newReplyDropper(t)
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	d := newDriver(t, c, nil)
	admin := serverClient(t)
	key := uniqueKey(t)

	p.armed.Store(true)
	_, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute})
	if p.armed.Load() {
		t.Fatal("the proxy never saw the acquire script")
	}
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("TryAcquire whose reply was lost = %v; want ErrUnavailable", err)
	}
	if n := admin.Exists(t.Context(), lockKey(key)).Val(); n != 0 {
		t.Fatal("the lock taken by the failed acquire was left behind")
	}
	// And the key is free for others at once.
	l, err := newDriver(t, admin, nil).TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute})
	if err != nil {
		t.Fatalf("TryAcquire after the cleanup: %v", err)
	}
	_ = l.Release(t.Context())
}

// An acquire cancelled while its command is in flight (the server took the
// lock, the reply is not back yet) must delete the lock it may have taken.
func TestAcquireCancelledInFlightCleansUp(t *testing.T) {
	p := newReplyDropper(t)
	p.hold = true
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	d := newDriver(t, c, nil)
	admin := serverClient(t)
	key := uniqueKey(t)

	p.armed.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute})
	if p.armed.Load() {
		t.Fatal("the proxy never saw the acquire script")
	}
	if !errors.Is(err, backend.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire cancelled in flight = %v; want ErrUnavailable and DeadlineExceeded", err)
	}
	if n := admin.Exists(t.Context(), lockKey(key)).Val(); n != 0 {
		t.Fatal("the lock taken by the cancelled acquire was left behind")
	}
}
