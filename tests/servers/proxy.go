package servers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from its own loopback address to a
// server's address; faults can be switched on and off while connections are
// open. Put it between a client and a server (dial [Proxy.Addr] instead of
// the server's address) to cut the client off ([Proxy.Blackhole]) or slow
// its link down ([Proxy.Delay]) without touching the server, which other
// clients keep reaching directly. [Proxy.FailNext] fails a single request
// (it never reaches the server) or drops a single reply (the server applied
// the request, the client never hears: an unknown outcome), and
// [Proxy.Cut] resets every connection.
//
// Each accepted connection gets its own connection to the target, dialled
// when the connection is accepted (or, during a blackhole, when it ends). A
// half-close (EOF) is passed on once what came before it has been
// delivered; a connection reset on one side, or a failed dial, closes both
// sides. Its methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	mu         sync.Mutex
	blackholed bool
	healed     chan struct{} // closed when the current blackhole ends
	delay      time.Duration
	closed     bool
	links      map[*link]bool
	shot       *shot // armed by FailNext, until it fires or Heal
}

// OneShot is a fault on a single request, for [Proxy.FailNext]. A request
// is a chunk of bytes a client sends (what one read of the proxy returns:
// usually one write of the client's), at least MinBytes long.
type OneShot struct {
	// DropReply: the request is delivered to the target, and its
	// connection is cut (both sides closed) as soon as the target sends
	// anything back on it, so the reply is lost: the server applied the
	// request and the client never hears. Otherwise the request is not
	// delivered and its connection is cut at once: the request fails and
	// the server never sees it.
	DropReply bool
	// Skip is how many requests pass before the one that fails.
	Skip int
	// MinBytes: a shorter chunk is not counted as a request. HTTP/2
	// control frames such as PING (17 bytes) and WINDOW_UPDATE (13) are
	// shorter than any gRPC request, so MinBytes 20 counts only requests
	// on an etcd client's connection. 0 counts every chunk.
	MinBytes int
	// Partition: when the fault fires the proxy also blackholes (as
	// [Proxy.Blackhole]) until [Proxy.Heal], so that nothing more passes:
	// a client cannot learn the outcome by asking again.
	Partition bool
}

// shot is an armed OneShot.
type shot struct {
	OneShot
	fired chan struct{} // closed when it fires
}

// fire closes s.fired (once: the caller took s out of the proxy) and, for
// a Partition, blackholes; p.mu is held.
func (p *Proxy) fireLocked(s *shot) {
	close(s.fired)
	if s.Partition && !p.blackholed {
		p.blackholed = true
		p.healed = make(chan struct{})
	}
}

// NewProxy starts a proxy that listens on 127.0.0.1 (a port of its own,
// [Proxy.Addr]) and forwards each connection to target (host:port), passing
// every byte through until a fault is switched on. Close it when done.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("servers: proxy to %s: %w", target, err)
	}
	p := &Proxy{ln: ln, target: target, done: make(chan struct{}), links: map[*link]bool{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr returns the proxy's address (127.0.0.1:port), for clients to dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// String returns a short description for test logs.
func (p *Proxy) String() string { return "proxy " + p.Addr() + "->" + p.target }

// Blackhole partitions the proxy's clients from the target, as a network
// partition does: connections stay open, and new ones are accepted, but no
// byte passes in either direction until [Proxy.Heal]. Nothing is lost: as
// TCP retransmits across a partition, the proxy stops reading, so that
// bytes sent meanwhile wait (in the senders' socket buffers, or in the
// proxy) and are delivered in order once the partition heals. A byte the
// proxy reads after Blackhole returns is not delivered before Heal; bytes
// being written at that moment may still arrive, as packets in flight do.
// A sender whose buffers fill up blocks, as it would across a partition.
// Blackhole leaves a [Proxy.Delay] in force; Heal ends both.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.blackholed {
		p.blackholed = true
		p.healed = make(chan struct{})
	}
}

// Delay makes the link slow: from now on every chunk of bytes the proxy
// reads, in each direction, is delivered d after it was read (a one-way
// latency of d), order kept. Chunks are queued, so throughput is not
// limited to one chunk per d. Chunks already read keep the delay they were
// read under. d <= 0 is back to no delay.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = max(d, 0)
}

// Heal ends every fault: a blackhole ends (what waited is delivered in
// order, and connections accepted during it are connected to the target
// now), the delay goes back to zero for chunks read from now on, and a
// one-shot fault that has not fired is disarmed.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackholed {
		p.blackholed = false
		close(p.healed)
	}
	p.delay = 0
	p.shot = nil
}

// FailNext arms the one-shot fault f: the next request a client sends
// through the proxy (on any of its connections), after f.Skip others,
// fails as f says. It returns a channel closed when the fault has fired.
// Arming again replaces a fault that has not fired (its channel is then
// never closed), and so does Heal (which disarms it). The connection that
// carried the request is cut: the client sees it closed, and a new
// connection through the proxy works (unless f.Partition).
func (p *Proxy) FailNext(f OneShot) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.shot = &shot{OneShot: f, fired: make(chan struct{})}
	return p.shot.fired
}

// takeShot reports the armed fault if a chunk of n bytes from a client is
// the request it fails (the fault is then disarmed), else nil. A fault
// that drops the request fires here.
func (p *Proxy) takeShot(n int) *shot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.shot
	if s == nil || n < s.MinBytes {
		return nil
	}
	if s.Skip > 0 {
		s.Skip--
		return nil
	}
	p.shot = nil
	if !s.DropReply {
		p.fireLocked(s)
	}
	return s
}

// Cut resets every connection open through the proxy, as a firewall or a
// NAT that forgets them does: both sides are closed at once, and what the
// proxy had read and not delivered yet (during a blackhole or a delay) is
// lost. New connections are accepted as before; Cut changes no fault.
func (p *Proxy) Cut() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.kill()
	}
}

// Close stops listening, closes every connection (both sides), and waits
// until the proxy's goroutines have ended. Closing twice is harmless.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.kill()
	}
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("servers: close %s: %w", p, err)
	}
	return nil
}

// serve accepts connections until the listener is closed.
func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		l := &link{p: p, client: c, dead: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.links[l] = true
		p.wg.Add(1)
		p.mu.Unlock()
		go p.run(l)
	}
}

// link is one proxied connection: the accepted client side and the
// connection dialled to the target.
type link struct {
	p      *Proxy
	client net.Conn
	dead   chan struct{} // closed by kill

	mu     sync.Mutex
	server net.Conn // nil until dialled
	killed bool
	// dropReply, once a request of a DropReply fault has been delivered:
	// the next bytes from the target cut the link instead.
	dropReply *shot
}

// kill closes both sides of l (at once; nothing queued is delivered).
func (l *link) kill() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.killed {
		return
	}
	l.killed = true
	close(l.dead)
	_ = l.client.Close()
	if l.server != nil {
		_ = l.server.Close()
	}
}

// run connects l to the target and forwards both ways until both
// directions have ended, then closes l.
func (p *Proxy) run(l *link) {
	defer p.wg.Done()
	defer func() {
		l.kill()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	// During a blackhole the connection to the target is not made yet: the
	// client's bytes wait in its socket buffers.
	if !p.awaitPass(l.dead) {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	var watch sync.WaitGroup
	watch.Go(func() { // a kill (Close) ends the dial
		select {
		case <-l.dead:
			cancel()
		case <-ctx.Done():
		}
	})
	var d net.Dialer
	s, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	watch.Wait()
	if err != nil {
		return // the client sees its connection closed
	}
	l.mu.Lock()
	if l.killed {
		l.mu.Unlock()
		_ = s.Close()
		return
	}
	l.server = s
	l.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(l, s, l.client) })
	wg.Go(func() { p.pipe(l, l.client, s) })
	wg.Wait()
}

// chunk is what one read returned, with the time it is due at the other
// end; shot is the DropReply fault whose request it is (nil for most).
type chunk struct {
	due  time.Time
	data []byte
	shot *shot
}

// pipe forwards from src to dst until src ends (EOF: dst is half-closed
// after what came before has been delivered) or l is killed. A read error
// other than EOF, or a failed write, kills l.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	up := src == l.client // client to target: where requests go
	q := make(chan chunk, 64)
	var wg sync.WaitGroup
	wg.Go(func() { // reader
		defer close(q)
		buf := make([]byte, 32<<10)
		for {
			if !p.awaitPass(l.dead) {
				return
			}
			n, err := src.Read(buf)
			var s *shot
			switch {
			case n > 0 && up:
				if s = p.takeShot(n); s != nil && !s.DropReply {
					l.kill() // the request is not delivered
					return
				}
			case n > 0 && l.replyDropped():
				return // the link is cut: the reply is not delivered
			}
			if n > 0 {
				p.mu.Lock()
				due := time.Now().Add(p.delay)
				p.mu.Unlock()
				select {
				case q <- chunk{due: due, data: append([]byte(nil), buf[:n]...), shot: s}:
				case <-l.dead:
					return
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					l.kill()
				}
				return
			}
		}
	})
	defer wg.Wait()

	var timer *time.Timer
	for c := range q {
		if wait := time.Until(c.due); wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
				defer timer.Stop()
			} else {
				timer.Reset(wait)
			}
			select {
			case <-timer.C:
			case <-l.dead:
				return
			}
		}
		if !p.awaitPass(l.dead) {
			return
		}
		if c.shot != nil {
			// The request goes out now: its reply will not be delivered.
			// Armed before the write: the target may answer, and the
			// other direction read the answer, before Write returns
			// (TestProxyDropReply failed 1 run in 200 so: the reply went
			// through and the fault never fired).
			l.mu.Lock()
			l.dropReply = c.shot
			l.mu.Unlock()
		}
		if _, err := dst.Write(c.data); err != nil {
			l.kill()
			return
		}
	}
	// src ended: pass the half-close on.
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// replyDropped is called with bytes from the target: if a DropReply
// fault's request went out on l, it fires the fault, cuts l and reports
// true.
func (l *link) replyDropped() bool {
	l.mu.Lock()
	s := l.dropReply
	l.dropReply = nil
	l.mu.Unlock()
	if s == nil {
		return false
	}
	l.p.mu.Lock()
	l.p.fireLocked(s)
	l.p.mu.Unlock()
	l.kill()
	return true
}

// awaitPass waits until no blackhole is in force, and reports true then, or
// false if dead is closed or the proxy is closed first.
func (p *Proxy) awaitPass(dead <-chan struct{}) bool {
	for {
		p.mu.Lock()
		closed, blackholed, healed := p.closed, p.blackholed, p.healed
		p.mu.Unlock()
		if closed {
			return false
		}
		if !blackholed {
			return true
		}
		select {
		case <-healed:
		case <-dead:
			return false
		case <-p.done:
			return false
		}
	}
}
