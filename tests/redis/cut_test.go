package redis_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redis"
)

// holdBack is a TCP proxy to the test server that delays, by hold, every
// chunk a client sends that contains all of a set of needles (an acquire
// of one key with one TTL, say, and not its release), and everything the
// client sends after it on that connection (TCP keeps the order): a
// request slowed down on its way (a retransmission, a loaded link or
// proxy) that reaches the server after its client gave up. When the client
// closes the connection, what it sent before is still delivered, then the
// close: the server runs a request that was on its way.
type holdBack struct {
	ln   net.Listener
	to   string
	hold time.Duration

	mu      sync.Mutex
	needles [][]byte
	held    chan struct{} // closed when a held chunk has been delivered

	wg    sync.WaitGroup
	conns sync.Map // net.Conn -> bool, closed at the end
}

// newHoldBack starts a holdBack proxy to the test server, closed at the end
// of the test.
func newHoldBack(t *testing.T, hold time.Duration) *holdBack {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdBack{ln: ln, to: serverAddr(t), hold: hold}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.conns.Range(func(c, _ any) bool {
			_ = c.(net.Conn).Close()
			return true
		})
		p.wg.Wait()
	})
	return p
}

func (p *holdBack) Addr() string { return p.ln.Addr().String() }

// arm makes the proxy hold back the chunks that contain every needle from
// now on; the channel returned is closed once such a chunk has reached the
// server.
func (p *holdBack) arm(needles ...string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.needles = nil
	for _, n := range needles {
		p.needles = append(p.needles, []byte(n))
	}
	p.held = make(chan struct{})
	return p.held
}

// match reports whether chunk b is to be held back, and the channel to
// close once it is delivered.
func (p *holdBack) match(b []byte) (bool, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.needles) == 0 {
		return false, nil
	}
	for _, n := range p.needles {
		if !bytes.Contains(b, n) {
			return false, nil
		}
	}
	return true, p.held
}

func (p *holdBack) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.conns.Store(c, true)
		p.conns.Store(s, true)
		type chunk struct {
			due  time.Time
			data []byte
			done chan struct{}
		}
		q := make(chan chunk, 1024)
		p.wg.Add(3)
		go func() { // client to the queue
			defer p.wg.Done()
			defer close(q)
			buf := make([]byte, 64<<10)
			var last time.Time
			for {
				n, err := c.Read(buf)
				if n > 0 {
					due := time.Now()
					hold, done := p.match(buf[:n])
					if hold {
						due = due.Add(p.hold)
					}
					if due.Before(last) {
						due = last // in order
					}
					last = due
					var d chan struct{}
					if hold {
						d = done
					}
					q <- chunk{due, bytes.Clone(buf[:n]), d}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // the queue to the server, in order, each when due
			defer p.wg.Done()
			for ch := range q {
				time.Sleep(time.Until(ch.due))
				if _, err := s.Write(ch.data); err != nil {
					return
				}
				if ch.done != nil {
					select {
					case <-ch.done:
					default:
						close(ch.done)
					}
				}
			}
			// The client closed: pass the close on after what it sent.
			if tc, ok := s.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
		}()
		go func() { // server to client
			defer p.wg.Done()
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					_, _ = c.Write(buf[:n]) // a closed client: the reply is lost
				}
				if err != nil {
					_ = s.Close()
					return
				}
			}
		}()
	}
}

// cutKinds are the three kinds of grant a cut acquire may leave behind.
var cutKinds = []struct {
	name string
	req  backend.Request
}{
	{"exclusive", backend.Request{}},
	{"reader", backend.Request{Shared: true}},
	{"permit", backend.Request{Shared: true, Permits: 3}},
}

// cutTTL is the TTL of the acquires the proxy holds back, spelled in
// their command ("59123"), as no other command of the tests spells it.
const cutTTL = 59123 * time.Millisecond

// leftHeld returns what key still holds on the server: a lock key whose
// value is a grant's (exclusive), or shared holders; "" for nothing.
func leftHeld(t *testing.T, admin *goredis.Client, key string) string {
	t.Helper()
	ctx := t.Context()
	lk := lockKey(key)
	v, err := admin.Get(ctx, lk).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		t.Fatal(err)
	}
	if v != "" && !strings.HasPrefix(v, "\x00") {
		return "the lock (PTTL " + admin.PTTL(ctx, lk).Val().String() + ")"
	}
	n, err := admin.ZCount(ctx, lk+":holders", "("+timeMillis(t, admin), "+inf").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n > 0 {
		return "shared holders (PTTL " + admin.PTTL(ctx, lk+":holders").Val().String() + ")"
	}
	return ""
}

// timeMillis returns the server's clock in milliseconds, as a decimal.
func timeMillis(t *testing.T, c *goredis.Client) string {
	t.Helper()
	now, err := c.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return strconv.FormatInt(now.UnixMilli(), 10)
}

// TestCutAcquireArrivingLateLeavesNothing: an acquire whose deadline ends
// while its command is on its way to the server (held back 600ms by a
// proxy, on a client with ContextTimeoutEnabled) returns at its deadline;
// its clean-up, sent at once on another connection, reaches the server
// before the acquire. The acquire must not then take the lock (or a
// permit, or a reader's place) for its full TTL: a cancelled acquire
// leaves nothing behind. It did, for all three kinds, and the key stayed
// held for the TTL (59s) by nobody.
func TestCutAcquireArrivingLateLeavesNothing(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	for _, kind := range cutKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			p := newHoldBack(t, 600*time.Millisecond)
			c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			d := newDriver(t, c, nil)
			key := uniqueKey(t)
			delivered := p.arm(lockKey(key), "59123")
			req := kind.req
			req.Key, req.TTL = key, cutTTL
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			l, err := d.TryAcquire(ctx, req)
			if err == nil {
				_ = l.Release(t.Context())
				t.Fatal("the acquire held back 600ms was granted within its 200ms deadline")
			}
			if !errors.Is(err, backend.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("TryAcquire cut by its deadline: %v, want ErrUnavailable and DeadlineExceeded", err)
			}
			select {
			case <-delivered:
			case <-time.After(20 * time.Second):
				t.Fatal("the proxy never delivered the held-back acquire")
			}
			// The late acquire has run (or runs now): give it, and any
			// clean-up after it, a second.
			time.Sleep(time.Second)
			if left := leftHeld(t, admin, key); left != "" {
				t.Fatalf("the acquire cut by its deadline left %s on the server", left)
			}
			// Nothing stands in another's way.
			o, err := newDriver(t, admin, nil).TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute})
			if err != nil {
				t.Fatalf("another's acquire after the cut one: %v", err)
			}
			_ = o.Release(t.Context())
		})
	}
}

// TestCutPipelinedAcquireArrivingLateLeavesNothing: the same through the
// driver's shared pipelines: an acquire queued behind another in flight
// goes in a pipeline whose reads time out with its caller's deadline (i/o
// timeout), while the pipeline is held back on its way; the clean-up of
// the failed batch went out at once and reached the server first.
func TestCutPipelinedAcquireArrivingLateLeavesNothing(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	for _, kind := range cutKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			p := newHoldBack(t, 600*time.Millisecond)
			h := &blockKey{key: lockKey(uniqueKey(t)), release: make(chan struct{}), entered: make(chan struct{}), piped: make(chan error, 1)}
			c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			d := newDriver(t, c, nil)
			c.AddHook(h) // after NewDriver: its rights check is a pipeline too

			// A lone acquire held back before any I/O: in flight, so
			// that the next goes through the pipe.
			other := make(chan error, 1)
			go func() {
				key := strings.TrimSuffix(strings.TrimPrefix(h.key, redis.DefaultPrefix+"{"), "}")
				l, err := d.TryAcquire(context.Background(), backend.Request{Key: key, TTL: time.Minute})
				if err == nil {
					err = l.Release(context.Background())
				}
				other <- err
			}()
			defer func() {
				close(h.release)
				if err := <-other; err != nil {
					t.Errorf("the held-back acquire: %v", err)
				}
			}()
			<-h.entered

			key := uniqueKey(t)
			delivered := p.arm(lockKey(key), "59123")
			req := kind.req
			req.Key, req.TTL = key, cutTTL
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			if l, err := d.TryAcquire(ctx, req); err == nil {
				_ = l.Release(t.Context())
				t.Fatal("the acquire held back 600ms was granted within its 200ms deadline")
			} else if !errors.Is(err, backend.ErrUnavailable) {
				t.Fatalf("TryAcquire cut by its deadline: %v, want ErrUnavailable", err)
			}
			select {
			case err := <-h.piped:
				t.Logf("the pipeline ended: %v", err)
			case <-time.After(20 * time.Second):
				t.Fatal("no pipeline ran (was the acquire pipelined at all?)")
			}
			select {
			case <-delivered:
			case <-time.After(20 * time.Second):
				t.Fatal("the proxy never delivered the held-back acquire")
			}
			time.Sleep(time.Second)
			if left := leftHeld(t, admin, key); left != "" {
				t.Fatalf("the pipelined acquire cut by its deadline left %s on the server", left)
			}
		})
	}
}

// TestCutAcquiresUnderLoadLeaveNothing: without a proxy, 30 goroutines
// make 60 TryAcquires each (a third exclusive, a third readers, a third
// permits of a semaphore large enough for all), with deadlines from 0 to
// 1.5ms, on a client with ContextTimeoutEnabled: many are cut while their
// command is on its way or being served. Once they are done and their
// clean-ups have had their bound (2s), nothing is held: every grant was
// released, every cut acquire left nothing. Seen before: tens of locks,
// readers and permits held for their TTL.
func TestCutAcquiresUnderLoadLeaveNothing(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	c := goredis.NewClient(&goredis.Options{Addr: serverAddr(t), ContextTimeoutEnabled: true, PoolSize: 40})
	t.Cleanup(func() { _ = c.Close() })
	d := newDriver(t, c, nil)
	const goroutines, attempts = 30, 60
	keys := make([]string, len(cutKinds))
	for i := range keys {
		keys[i] = uniqueKey(t)
	}
	var (
		wg           sync.WaitGroup
		granted, cut atomic.Int64
	)
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 24))
			for i := range attempts {
				k := (g + i) % len(cutKinds)
				req := cutKinds[k].req
				req.Key, req.TTL = keys[k], time.Minute
				if k == 2 {
					req.Permits = goroutines + 1 // never full
				}
				ctx, cancel := context.WithTimeout(t.Context(), time.Duration(rng.IntN(1500))*time.Microsecond)
				l, err := d.TryAcquire(ctx, req)
				cancel()
				if err == nil {
					granted.Add(1)
					if err := l.Release(context.Background()); err != nil {
						t.Errorf("Release: %v", err)
					}
					continue
				}
				var held *backend.HeldError
				if errors.As(err, &held) {
					continue // an exclusive lock held by another goroutine
				}
				if !errors.Is(err, backend.ErrUnavailable) {
					t.Errorf("TryAcquire cut short: %v, want ErrUnavailable", err)
				}
				cut.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d granted, %d cut short", granted.Load(), cut.Load())
	if cut.Load() == 0 {
		t.Fatalf("no acquire was cut short (%d granted): the test tested nothing", granted.Load())
	}
	// The clean-ups are bounded by 2s each, and run after their acquires.
	time.Sleep(3 * time.Second)
	for i, key := range keys {
		if left := leftHeld(t, admin, key); left != "" {
			t.Errorf("%s key: %s held after every acquire returned and every grant was released", cutKinds[i].name, left)
		}
	}
}

// TestCutWhileHeldThenFreed: an acquire cut short while another holds the
// key leaves its tombstone in the key's fencing counter all the same (its
// clean-up has nothing to delete); the holder then releases before the
// acquire, held back on its way, arrives and finds the key free: the
// tombstone refuses it. Meanwhile Inspect reports the holder's token (the
// counter's number, tombstones after it), and tokens keep increasing over
// the grants that follow.
func TestCutWhileHeldThenFreed(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	ad := newDriver(t, admin, nil)
	p := newHoldBack(t, 600*time.Millisecond)
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	d := newDriver(t, c, nil)
	ctx := t.Context()
	key := uniqueKey(t)

	h, err := ad.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	delivered := p.arm(lockKey(key), "59123")
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if l, err := d.TryAcquire(cctx, backend.Request{Key: key, TTL: cutTTL}); err == nil {
		_ = l.Release(ctx)
		t.Fatal("the acquire held back was granted within its deadline")
	}
	fence := admin.Get(ctx, lockKey(key)+":fence").Val()
	if !strings.Contains(fence, "!") {
		t.Errorf("fencing counter %q after the cut acquire's clean-up: no tombstone", fence)
	}
	info, err := ad.Inspect(ctx, key)
	if err != nil || !info.Held || uint64(info.Token) != h.Token() {
		t.Errorf("Inspect with a tombstone in the counter: %+v, %v; want held with token %d", info, err, h.Token())
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-delivered:
	case <-time.After(20 * time.Second):
		t.Fatal("the proxy never delivered the held-back acquire")
	}
	time.Sleep(time.Second)
	if left := leftHeld(t, admin, key); left != "" {
		t.Fatalf("the acquire cut while the key was held, arriving once it was free, left %s", left)
	}
	last := h.Token()
	for i := range 3 {
		l, err := ad.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute, Shared: i == 1})
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Errorf("grant %d after the tombstone: token %d, not above %d", i, l.Token(), last)
		}
		last = l.Token()
		if info, err := ad.Inspect(ctx, key); err != nil || uint64(info.Token) != l.Token() {
			t.Errorf("Inspect of grant %d: %+v, %v; want token %d", i, info, err, l.Token())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if fence := admin.Get(ctx, lockKey(key)+":fence").Val(); !strings.Contains(fence, "!") {
		t.Errorf("fencing counter %q: the grants dropped the tombstone before its minute", fence)
	}
}
