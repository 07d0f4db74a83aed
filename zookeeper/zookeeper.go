package zookeeper

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/bg"
)

var (
	_ backend.Queuer         = (*Driver)(nil)
	_ backend.BatchRefresher = (*Driver)(nil)
	_ backend.LossNotifier   = (*lease)(nil)
	_ backend.Anchored       = (*lease)(nil)
)

// Defaults of [Options].
const (
	DefaultPrefix         = "/dlock"
	DefaultSessionTimeout = 40 * time.Second
	// DefaultTickTime is ZooKeeper's default tickTime.
	DefaultTickTime = 2 * time.Second
)

// The session timeouts go-zookeeper can ask for: it sends a whole number of
// milliseconds as an int32 (a longer one wraps to a negative number), and
// bounds its handshake by the timeout (below a millisecond, every handshake
// times out at once). The server may still negotiate the one asked.
const (
	minSessionTimeout = time.Millisecond
	maxSessionTimeout = math.MaxInt32 * time.Millisecond
)

// The tickTimes Options.TickTime accepts: ZooKeeper's is a whole number of
// milliseconds in an int.
const (
	minTickTime = time.Millisecond
	maxTickTime = math.MaxInt32 * time.Millisecond
)

// protectedPrefix marks a lock node created in protection mode: its name is
// protectedPrefix + a random GUID + "-lock-" + the server's sequence number,
// so that after a connection loss during the create we can find our node.
const protectedPrefix = "_c_"

// retryPause is the pause between attempts of background clean-ups, and
// before a request cut by a connection loss is tried again.
const retryPause = 200 * time.Millisecond

// connectTimeout is go-zookeeper's timeout for dialling one server (its
// default, which we keep); after trying every server it pauses a second.
const connectTimeout = time.Second

// cutOffMargin is added to the session timeout before a waiter without a
// connection gives up (see [Driver.cutOff]): the server expires sessions on
// tick boundaries, rounding the expiry up to the next tick (tickTime, 2s by
// default), so a session can outlive its timeout by up to a tick.
const cutOffMargin = 2 * time.Second

// leaveTimeout bounds the synchronous deletion of a TryAcquire's node when
// the lock is held; past it the node is deleted in the background.
const leaveTimeout = time.Second

// Options configure the ZooKeeper backend. The zero value (or nil) is valid.
type Options struct {
	// Prefix is the znode under which the locks live, an absolute path.
	// Default DefaultPrefix ("/dlock"). It is created (persistent) if
	// missing, with a persistent child "!dlock" that keeps it from being
	// deleted while idle (see "Security" in the package doc).
	Prefix string
	// SessionTimeout is the session timeout asked of the server, which
	// may negotiate it down (its maxSessionTimeout) or up. Default
	// DefaultSessionTimeout (40s, the maximum of a default server); from
	// 1ms to 2^31-1 ms (about 596h), what the client library can send.
	// Lease TTLs may not exceed two thirds of the negotiated value less
	// TickTime; see "How long the session lives" in the package doc. A
	// Locker TTL (Locker.TTL) above that bound of the timeout asked is
	// refused before any I/O (unless the timeout is below two ticks,
	// which servers raise).
	SessionTimeout time.Duration
	// TickTime is the servers' tickTime: set it if yours differ from
	// ZooKeeper's default. Default DefaultTickTime (2s); from 1ms to
	// 2^31-1 ms. It enters the bound on lease TTLs (Limits().MaxTTL is
	// the negotiated session timeout less a third of it, less TickTime):
	// a value smaller than the servers' tickTime is unsafe, a larger one
	// only shortens the longest TTL.
	TickTime time.Duration
	// Auth, if set, is "user:password" for ZooKeeper digest
	// authentication (sent in plaintext unless TLS is set). With Auth and
	// no ACL, the nodes dlock creates grant every right to that identity
	// and to no one else (zk.AuthACL(zk.PermAll)): Lockers sharing the
	// identity share the locks, and clients without it can neither read
	// nor create, delete or change them. See "Security" in the package doc.
	Auth string
	// ACL, if set, is the ACL of every node dlock creates: the prefix and
	// its missing ancestors, its sentinel child, the key directories and
	// the lock nodes. It
	// lets several identities share locks: give each identity (such as
	// zk.DigestACL(zk.PermAll, "alice", password), or the digest id
	// "alice:<base64 of SHA-1 of alice:password>" when the password is
	// not yours to know) at least read, create and delete, and have every
	// Locker use the same ACL. Default: zk.AuthACL(zk.PermAll) with Auth,
	// zk.WorldACL(zk.PermAll) without (every client may do anything,
	// ZooKeeper's own default). Nodes that already exist keep their ACL.
	ACL []zk.ACL
	// TLS, if set, is the TLS configuration of the connections to the
	// servers (their secureClientPort); ServerName defaults to each
	// server's host as given (not the address it resolves to). Default:
	// plain TCP.
	TLS *tls.Config
	// Dialer, if set, opens the TCP connections to the servers (tests use
	// it to cut connections); with TLS, the handshake runs over them.
	Dialer zk.Dialer
	// Locker configures the Locker that [New] returns. Nil means defaults.
	// Its Logger also receives the ZooKeeper client's warnings and the
	// session's state changes (default slog.Default()): the one field
	// NewDriver reads.
	Locker *dlock.Options
}

// Driver is the ZooKeeper implementation of backend.Driver,
// backend.Queuer, backend.BatchRefresher, backend.Inspector and
// backend.ChangeWatcher. It owns one ZooKeeper session, shared by all
// leases taken through it, exclusive and shared (semaphores and read-write
// locks, which queue with the exclusive ones). An acquire's holder
// description (backend.Request.Holder) is the data of its lock node,
// written by the create that makes the node; [Driver.Inspect] reads it
// back, and [Driver.WatchChanges] reports changes of a key's holder and
// queue through a child watch on the key's directory, without polling.
type Driver struct {
	conn    *zk.Conn
	events  <-chan zk.Event // the client's, closed when its session loop ends
	prefix  string
	servers int
	acl     []zk.ACL
	log     *slog.Logger

	negotiated atomic.Int64  // session timeout the server granted, in ms
	tick       time.Duration // the servers' tickTime (Options.TickTime)
	hosts      atomic.Int64  // server addresses the client cycles through

	// The connection's state, for waiters and retries: whether the
	// session is connected, since when it is not, how many servers the
	// client has dialled since then, and a channel closed (and replaced)
	// on every change.
	linkMu      sync.Mutex
	linkUp      bool
	linkDown    time.Time
	dials       int
	linkChanged chan struct{}
	hadSession  atomic.Bool // the client has had a session (its log lines are warnings from then on)

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	once   sync.Once

	bg bg.Group // calls abandoned by their callers, clean-ups, probes, the loss dispatcher

	// The held leases, for the loss watches and refreshes (lease.go).
	leaseMu sync.Mutex
	leases  map[string]*lease // by node path
	gen     uint64            // connections with our session so far (StateHasSession), and expiries
	probes  uint64            // session probes sent so far
	pending []lossNote        // losses for the dispatcher to report
	wake    chan struct{}     // (capacity 1) pending has entries

	probeMu   sync.Mutex
	nextProbe *probe // the probe that refreshes join, not sent yet
	probing   bool   // runProbes is running

	// The deletion watches that permit waiters share (see watchGone), by
	// node path.
	goneMu sync.Mutex
	gone   map[string]*goneWatch
}

// New connects to the ensemble (servers are host:port), waits for a session,
// creates the prefix node if it is missing, and returns a Locker configured
// by opts.Locker (its default TTL is Limits().MaxTTL if that is shorter
// than backend.DefaultTTL, as on the default 40s session and 2s tick, where
// it is about 24.67s; see dlock.Options.TTL), whose Logger the backend logs
// to as well. Closing the Locker closes the session, which deletes every
// lock node it still owns. Errors wrap [backend.ErrInvalidConfig] (bad
// options, opts.Locker included, before any I/O, among them a Locker TTL
// above the bound of the session timeout asked, which wraps
// [backend.ErrInvalidTTL] too; or a granted session timeout too short for
// the tick, see [Driver.Limits]) or [backend.ErrUnavailable].
func New(ctx context.Context, servers []string, opts *Options) (*dlock.Locker, error) {
	var lo *dlock.Options
	if opts != nil {
		lo = opts.Locker
	}
	return driver.Build(lo, limits, func() (backend.Driver, error) { return NewDriver(ctx, servers, opts) })
}

// NewDriver is [New] without the Locker, for callers that wrap the driver.
func NewDriver(ctx context.Context, servers []string, opts *Options) (*Driver, error) {
	return newDriver(ctx, servers, opts, nil)
}

// dialHooks let Open (open.go) see the client's dials: note gets the
// error of every dial, TLS handshake included, and conn wraps every
// connection made.
type dialHooks struct {
	note func(error)
	conn func(net.Conn) net.Conn
}

// newDriver is NewDriver, with hooks (nil: none) on the client's dials.
func newDriver(ctx context.Context, servers []string, opts *Options, hooks *dialHooks) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.SessionTimeout == 0 {
		o.SessionTimeout = DefaultSessionTimeout
	}
	if o.TickTime == 0 {
		o.TickTime = DefaultTickTime
	}
	log := slog.Default()
	if o.Locker != nil && o.Locker.Logger != nil {
		log = o.Locker.Logger
	}
	switch {
	case len(servers) == 0:
		return nil, fmt.Errorf("%w: zookeeper: no servers", backend.ErrInvalidConfig)
	case o.SessionTimeout < 0:
		return nil, fmt.Errorf("%w: zookeeper: negative SessionTimeout %v", backend.ErrInvalidConfig, o.SessionTimeout)
	case o.SessionTimeout < minSessionTimeout || o.SessionTimeout > maxSessionTimeout:
		return nil, fmt.Errorf("%w: zookeeper: SessionTimeout %v: want %v up to %v", backend.ErrInvalidConfig, o.SessionTimeout, minSessionTimeout, maxSessionTimeout)
	case o.TickTime < minTickTime || o.TickTime > maxTickTime:
		return nil, fmt.Errorf("%w: zookeeper: TickTime %v: want the servers' tickTime, %v up to %v", backend.ErrInvalidConfig, o.TickTime, minTickTime, maxTickTime)
	case o.Locker != nil && o.SessionTimeout >= 2*o.TickTime && o.Locker.TTL > maxTTL(o.SessionTimeout, o.TickTime):
		// The bound of the timeout asked; servers may negotiate it
		// down, checked once the session is granted (a timeout below
		// two ticks, which they raise, is left to that check).
		return nil, fmt.Errorf("%w (%w): zookeeper: the Locker's TTL %v (ttl) is above %v, the longest a session timeout of %v (session_timeout) "+
			"allows with a tick of %v (tick_time): two thirds of the session less a tick (see Driver.Limits)",
			backend.ErrInvalidConfig, backend.ErrInvalidTTL, o.Locker.TTL, maxTTL(o.SessionTimeout, o.TickTime), o.SessionTimeout, o.TickTime)
	case checkPrefix(o.Prefix) != nil:
		return nil, checkPrefix(o.Prefix)
	case o.Auth != "" && !strings.Contains(o.Auth, ":"):
		return nil, fmt.Errorf("%w: zookeeper: Auth: want user:password", backend.ErrInvalidConfig)
	case checkACL(o.ACL, o.Auth) != nil:
		return nil, checkACL(o.ACL, o.Auth)
	}
	for _, s := range servers {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return nil, fmt.Errorf("%w: zookeeper: server %q: want host:port", backend.ErrInvalidConfig, s)
		}
	}

	d := &Driver{prefix: o.Prefix, servers: len(servers), tick: o.TickTime, log: log, acl: o.ACL,
		linkDown: time.Now(), linkChanged: make(chan struct{}),
		leases: make(map[string]*lease), wake: make(chan struct{}, 1), gone: make(map[string]*goneWatch)}
	switch {
	case len(d.acl) > 0:
	case o.Auth != "":
		d.acl = zk.AuthACL(zk.PermAll)
	default:
		d.acl = zk.WorldACL(zk.PermAll)
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	dial := o.Dialer
	if dial == nil {
		dial = net.DialTimeout
	}
	hosts := &hostList{d: d}
	d.warnTransport(servers, &o)
	session := make(chan struct{}, 1)
	conn, events, err := zk.Connect(servers, o.SessionTimeout,
		zk.WithLogger(zkLogger{log: log, closing: d.ctx, up: &d.hadSession}),
		zk.WithLogInfo(false),
		zk.WithHostProvider(hosts),
		zk.WithDialer(func(network, addr string, timeout time.Duration) (net.Conn, error) {
			d.noteDial()
			c, err := dialServer(dial, o.TLS, hosts.host(addr), network, addr, timeout)
			if hooks != nil {
				hooks.note(err)
			}
			if err != nil {
				return nil, err
			}
			if hooks != nil {
				c = hooks.conn(c)
			}
			return &timeoutConn{Conn: c, d: d}, nil
		}),
		zk.WithEventCallback(func(ev zk.Event) {
			d.onEvent(ev)
			d.goneEvent(ev)
			if ev.Type != zk.EventSession {
				return
			}
			switch ev.State {
			case zk.StateHasSession:
				d.hadSession.Store(true)
				d.setLink(true)
				select {
				case session <- struct{}{}:
				default:
				}
			case zk.StateDisconnected:
				d.setLink(false)
				if d.ctx.Err() != nil { // Close ends the session: nothing is uncertain
					d.log.Debug("dlock/zookeeper: disconnected by Close", "server", ev.Server)
					return
				}
				if !d.hadSession.Load() { // still opening: no lease yet, New reports the failure
					d.log.Debug("dlock/zookeeper: disconnected before a session", "server", ev.Server)
					return
				}
				d.log.Warn("dlock/zookeeper: disconnected; leases are uncertain until the session is back", "server", ev.Server)
			case zk.StateExpired:
				d.setLink(false)
				d.log.Warn("dlock/zookeeper: session expired; its leases are lost")
			}
		}),
	)
	if err != nil {
		d.cancel()
		return nil, fmt.Errorf("%w: zookeeper: %w", backend.ErrInvalidConfig, err)
	}
	d.conn = conn
	d.events = events
	d.bg.Go(d.dispatch)
	fail := func(err error) (*Driver, error) {
		_ = d.Close()
		return nil, err
	}
	select {
	case <-session:
	case <-ctx.Done():
		return fail(fmt.Errorf("%w: zookeeper: no session with %v: %w", backend.ErrUnavailable, servers, ctx.Err()))
	}
	if o.Auth != "" {
		if err := d.do(ctx, func() error { return conn.AddAuth("digest", []byte(o.Auth)) }); err != nil {
			return fail(unavailable("authenticating", err))
		}
	}
	if err := d.checkSession(); err != nil {
		return fail(err)
	}
	if err := d.ensurePrefix(ctx); err != nil {
		return fail(d.openErr(err, o.Auth))
	}
	if err := d.checkPrefixACL(ctx, servers, &o); err != nil {
		return fail(err)
	}
	return d, nil
}

// checkSession refuses a granted session timeout that leaves no TTL of at
// least backend.MinTTL under the bound (see [Driver.Limits]).
func (d *Driver) checkSession() error {
	timeout := d.SessionTimeout()
	if bound := maxTTL(timeout, d.tick); bound < backend.MinTTL {
		return fmt.Errorf("%w: zookeeper: the session timeout granted, %v, is too short for a tick of %v: "+
			"the longest safe TTL, %v less a third of it less a tick, is %v, below dlock's floor of %v "+
			"(ask for a longer SessionTimeout, or set TickTime to the servers' tickTime if it is shorter)",
			backend.ErrInvalidConfig, timeout, d.tick, timeout, bound, backend.MinTTL)
	}
	return nil
}

// timeoutConn records the session timeout the server negotiated, which the
// client library keeps to itself: it is the second int32 of the first frame
// the server sends on a connection (the connect response).
type timeoutConn struct {
	net.Conn
	d    *Driver
	head [12]byte
	n    int
}

func (c *timeoutConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.n < len(c.head) && n > 0 {
		c.n += copy(c.head[c.n:], p[:n])
		if c.n == len(c.head) {
			if ms := int32(binary.BigEndian.Uint32(c.head[8:])); ms > 0 {
				c.d.negotiated.Store(int64(ms))
			}
		}
	}
	return n, err
}

// hostList is the client's host provider. It does what go-zookeeper's
// DNSHostProvider does (resolve every server once, shuffle the addresses,
// go round them), and remembers the host each address was resolved from:
// TLS verifies the name given (a certificate for zk1.example.com rarely
// names its address), while the client dials addresses. It records how
// many addresses there are (a host name may resolve to several).
type hostList struct {
	d          *Driver
	mu         sync.Mutex
	addrs      []string
	names      map[string]string // address → host, as given
	curr, last int
}

// lookupTimeout bounds the resolution of the servers (DNSHostProvider's).
const lookupTimeout = 3 * time.Second

// Init resolves the servers.
func (h *hostList) Init(servers []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	var addrs []string
	names := make(map[string]string)
	for _, s := range servers {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			return err
		}
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			return err
		}
		for _, ip := range ips {
			a := net.JoinHostPort(ip, port)
			if _, ok := names[a]; !ok {
				names[a] = host
			}
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return fmt.Errorf("no addresses found for %q", servers)
	}
	mrand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	h.mu.Lock()
	h.addrs, h.names, h.curr, h.last = addrs, names, -1, -1
	h.mu.Unlock()
	h.d.hosts.Store(int64(len(addrs)))
	return nil
}

// Len returns the number of addresses.
func (h *hostList) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.addrs)
}

// Next returns the next address to dial; retryStart reports that the
// client has gone round them all since its last connection.
func (h *hostList) Next() (addr string, retryStart bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.curr = (h.curr + 1) % len(h.addrs)
	retryStart = h.curr == h.last
	if h.last == -1 {
		h.last = 0
	}
	return h.addrs[h.curr], retryStart
}

// Connected records a connection to the current address.
func (h *hostList) Connected() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = h.curr
}

// host returns the server's host, as given, that addr was resolved from.
func (h *hostList) host(addr string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n, ok := h.names[addr]; ok {
		return n
	}
	n, _, _ := net.SplitHostPort(addr)
	return n
}

// zkLogger sends the client library's log lines to slog: at Warn, or at
// Debug before the first session (New returns the failure itself, with the
// last dial error, so failed dials while opening are not logged twice) and
// once closing has ended (the lines of a connection Close ends).
type zkLogger struct {
	log     *slog.Logger
	closing context.Context
	up      *atomic.Bool // the Driver has had a session
}

func (l zkLogger) Printf(format string, args ...any) {
	level := slog.LevelWarn
	if l.closing.Err() != nil || !l.up.Load() {
		level = slog.LevelDebug
	}
	l.log.Log(context.Background(), level, "dlock/zookeeper: "+fmt.Sprintf(format, args...))
}

// setLink records that the session is connected (up) or not.
func (d *Driver) setLink(up bool) {
	d.linkMu.Lock()
	defer d.linkMu.Unlock()
	if up == d.linkUp {
		return
	}
	d.linkUp = up
	if !up {
		d.linkDown = time.Now()
		d.dials = 0
	}
	close(d.linkChanged)
	d.linkChanged = make(chan struct{})
}

// noteDial counts a dial of the client (it dials one server at a time, in
// turn, while it has no session).
func (d *Driver) noteDial() {
	d.linkMu.Lock()
	defer d.linkMu.Unlock()
	d.dials++
}

// reconnectCycle is how long go-zookeeper takes at most to try each of n
// servers once: a connect timeout per server, and the pause of a second it
// makes after going through the list.
func reconnectCycle(n int) time.Duration { return time.Duration(n)*connectTimeout + time.Second }

// noServer decides what a zk.ErrNoServer (err) means. The client fails
// the requests it has not sent with it whenever it comes round to the
// first server of its list again, which after the loss of a connection to
// the only server is at once, before dialling anything: on its own it does
// not mean that no server answers. It is final (noServer returns an error)
// only once the connection has been down for a full reconnect cycle and
// the client has dialled every server since; until then (nil) the request
// is tried again, like one cut by a connection loss.
func (d *Driver) noServer(err error) error {
	n := max(int(d.hosts.Load()), d.servers)
	d.linkMu.Lock()
	defer d.linkMu.Unlock()
	off := time.Since(d.linkDown)
	if d.linkUp || d.dials < n || off < reconnectCycle(n) {
		return nil
	}
	return fmt.Errorf("no server answered for %v (each of the %d addresses tried): %w", off.Round(time.Millisecond), n, err)
}

// cutOff returns an ErrUnavailable error once the session has been without
// a connection for longer than its timeout plus cutOffMargin: the server
// may have expired it by then, unless the whole ensemble is down (a new
// leader gives every session a full timeout again, so after an election
// the session can outlive this bound; a waiter that gives up abandons its
// node all the same). Otherwise it returns the time left before that (0
// while connected) and a channel closed when the connection's state
// changes.
func (d *Driver) cutOff() (left time.Duration, changed <-chan struct{}, err error) {
	d.linkMu.Lock()
	defer d.linkMu.Unlock()
	if d.linkUp {
		return 0, d.linkChanged, nil
	}
	timeout := d.SessionTimeout()
	bound := timeout + cutOffMargin
	off := time.Since(d.linkDown)
	if off >= bound {
		return 0, nil, fmt.Errorf("%w: zookeeper: no connection to the ensemble for %v, longer than the session timeout %v and a margin of %v "+
			"(the session may have expired, or the ensemble is down)", backend.ErrUnavailable, off.Round(time.Millisecond), timeout, cutOffMargin)
	}
	return bound - off, d.linkChanged, nil
}

// SessionTimeout returns the session timeout the server granted.
func (d *Driver) SessionTimeout() time.Duration {
	return time.Duration(d.negotiated.Load()) * time.Millisecond
}

// ValidateKey accepts every key the dlock layer accepts: keys are encoded.
func (d *Driver) ValidateKey(string) error { return nil }

// Limits: a lease's TTL may not exceed the negotiated session timeout less
// a third of it (the longest gap between the client's requests) less the
// servers' tickTime (Options.TickTime), so that its Deadline comes before
// the session's expiry even when the last touch of the session the leader
// heard of is a request older than the one the Deadline counts from (see
// "How long the session lives" in the package doc). On the default 40s
// session and 2s tick that is about 24.67s.
func (d *Driver) Limits() backend.Limits {
	// Never 0, which would mean no limit (a server that negotiates a
	// shorter timeout after a reconnect): at worst every TTL is refused.
	return backend.Limits{MaxTTL: max(maxTTL(d.SessionTimeout(), d.tick), 1)}
}

// maxTTL is the longest TTL a session of timeout allows, on servers that
// tick every tick: go-zookeeper sends a request (a ping if nothing else) at
// least every third of the timeout, and a follower relays the touch to the
// leader within a tick (its reply to the leader's PING, sent every half
// tick, plus delivery), so the leader's expiry is at least timeout -
// timeout/3 - tick after any request of ours it answered.
func maxTTL(timeout, tick time.Duration) time.Duration {
	return timeout - timeout/3 - tick
}

// limits are the Driver's Limits known before any I/O (none: the TTL's
// ceiling comes from the session timeout the server grants).
var limits = backend.Limits{}

// Guarantees: consensus-grade fencing (czxid), FIFO, shared leases
// (semaphores and readers, on the same queue; see "Shared leases" in the
// package doc), and a majority of the ensemble (counted from the server
// list) must be up.
func (d *Driver) Guarantees() backend.Guarantees {
	return backend.Guarantees{
		Backend:           "zookeeper",
		Fencing:           backend.FencingConsensus,
		ToleratedFailures: (d.servers - 1) / 2,
		FIFO:              true,
		Shared:            true,
		Notes: "Exclusion and tokens (czxid) come from ZooKeeper's atomic broadcast. A holder cut off " +
			"from the ensemble may believe it holds the lock until its Deadline; the protected resource " +
			"must check tokens.",
	}
}

// As supports **zk.Conn (the driver's connection; do not close it). From
// a *dlock.Locker: driver.LockerAs(locker, &conn).
func (d *Driver) As(target any) bool {
	if p, ok := target.(**zk.Conn); ok {
		*p = d.conn
		return true
	}
	return false
}

// Close closes the session (the server deletes the lock nodes it still
// owns) and waits for the driver's background work.
func (d *Driver) Close() error {
	d.once.Do(func() {
		d.bg.Close()
		d.cancel()
		if d.conn != nil {
			d.conn.Close()
			// Wait (briefly: a frozen server may never answer) for the
			// session's loop to end, so that its last events and log
			// lines come before Close returns.
			t := time.NewTimer(connectTimeout)
			defer t.Stop()
			for open := true; open; {
				select {
				case _, open = <-d.events:
				case <-t.C:
					open = false
				}
			}
		}
		d.bg.Wait()
	})
	return nil
}

// do runs f, a blocking ZooKeeper call, and returns its error, or ctx's if
// ctx ends first; f then finishes in the background (Close waits for it).
func (d *Driver) do(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan error, 1)
	if !d.bg.Go(func() { done <- f() }) {
		return backend.ErrClosed
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// read is do for a read (idempotent) call: after a connection loss, or a
// request the client could not send yet, it tries again (see again).
func (d *Driver) read(ctx context.Context, queued bool, f func() error) error {
	for {
		err := d.do(ctx, f)
		if err == nil {
			return nil
		}
		if err := d.again(ctx, err, queued); err != nil {
			return err
		}
	}
}

// again decides whether a call that failed with err is tried again: it
// pauses and returns nil if so, and returns the error to report if not.
// A call cut by a connection loss (connLost), or one the client could not
// send (zk.ErrNoServer, see noServer), is tried again while the client
// reconnects, until the session has been cut off for longer than its
// timeout (cutOff), ctx ends or the driver is closed. For a waiter already
// in the queue (queued), zk.ErrNoServer is never final: its node lives as
// long as its session, so only cutOff ends its wait. For anyone else it is,
// after a full reconnect cycle.
func (d *Driver) again(ctx context.Context, err error, queued bool) error {
	switch {
	case errors.Is(err, zk.ErrNoServer):
		if !queued {
			if ferr := d.noServer(err); ferr != nil {
				return ferr
			}
		}
	case !connLost(err):
		return err
	}
	if _, _, cerr := d.cutOff(); cerr != nil {
		return fmt.Errorf("%w (last error: %w)", cerr, err)
	}
	t := time.NewTimer(retryPause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-d.ctx.Done():
		return err
	case <-t.C:
		return nil
	}
}

// sentinel is the name of a persistent child dlock keeps under the prefix
// (with the Locker's ACL), so that the prefix is never empty: ZooKeeper
// refuses to delete a node with children, and deleting the sentinel
// needs the right to delete children of the prefix. Without it, a client
// allowed to delete children of the prefix's parent (the root, world:anyone,
// for /dlock) could delete an idle prefix, whose key directories the
// server removes once empty, and create it again with an ACL of its own.
// No key's directory can have this name: encodeKey writes '!' as %21.
const sentinel = "!dlock"

// ensurePrefix creates the prefix node, its missing ancestors and the
// sentinel under it (see sentinel) if they are missing. Its errors are
// ZooKeeper's, wrapped with what was being created.
func (d *Driver) ensurePrefix(ctx context.Context) error {
	if err := d.ensurePath(ctx, d.prefix); err != nil {
		return err
	}
	err := d.do(ctx, func() error {
		_, err := d.conn.Create(d.prefix+"/"+sentinel, nil, 0, d.acl)
		return err
	})
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("creating %s/%s: %w", d.prefix, sentinel, err)
	}
	return nil
}

// ensurePath creates the persistent node path and its ancestors if missing.
func (d *Driver) ensurePath(ctx context.Context, path string) error {
	for i := 1; i <= len(path); i++ {
		if i < len(path) && path[i] != '/' {
			continue
		}
		p := path[:i]
		err := d.do(ctx, func() error {
			_, err := d.conn.Create(p, nil, 0, d.acl)
			if errors.Is(err, zk.ErrNoAuth) {
				// The server checks the parent's ACL before
				// whether the node exists: one we may not
				// create may be there already.
				if ok, _, eerr := d.conn.Exists(p); eerr == nil && ok {
					return nil
				}
			}
			return err
		})
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("creating %s: %w", p, err)
		}
	}
	return nil
}

// parent is the container node under which key's lock nodes queue.
func (d *Driver) parent(key string) string { return d.prefix + "/" + encodeKey(key) }

// seq returns the sequence number the server appended to a lock node name
// (ZooKeeper formats a signed 32-bit counter with %010d, so it wraps to
// negative numbers).
func seq(name string) (int32, bool) {
	i := strings.LastIndex(name, "-lock-")
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(name[i+len("-lock-"):], 10, 32)
	return int32(n), err == nil
}

// before reports whether sequence number a comes before b, allowing for
// the counter's wrap-around (a queue never spans 2^31 creations).
func before(a, b int32) bool { return int32(uint32(a)-uint32(b)) < 0 }

// holderData is the data of a lock node for holder (a
// backend.Request.Holder): nil for none, so that such a create is the same
// request as one without holders.
func holderData(holder string) []byte {
	if holder == "" {
		return nil
	}
	return []byte(holder)
}

func newGUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// create makes our lock node under parent in protection mode, with tag in
// its name (a shared lease's kind, see kind.tag; "" for an exclusive lease)
// and data as its data (the holder description, nil for none), and returns
// its path. If ctx ends first, the node (once created) is deleted in the
// background. So is a node whose create may have reached the server but
// could not be found (the connection broke and the client reached no
// server for a full reconnect cycle): the error is returned then, and a
// background task deletes the node carrying our GUID once it can.
func (d *Driver) create(ctx context.Context, parent, tag string, data []byte) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	guid := newGUID()
	type result struct {
		path string
		err  error
	}
	ch := make(chan result, 1)
	// Who takes the result: the caller (taken) or, once the caller has
	// gone, the goroutine itself (abandoned), which then deletes the node.
	const (
		pending int32 = iota
		taken
		abandoned
	)
	var state atomic.Int32
	started := d.bg.Go(func() {
		p, maybe, err := d.createProtected(parent, guid, tag, data)
		if state.CompareAndSwap(pending, taken) {
			ch <- result{p, err}
		} else if p != "" {
			d.deleteNode(p)
		}
		if maybe {
			// The node may exist and we could not find it: delete
			// whatever carries our GUID once we can (the caller
			// has its error already).
			d.deleteByGUID(parent, guid)
		}
	})
	if !started {
		return "", backend.ErrClosed
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return "", unavailable("creating the lock node", r.err)
		}
		return r.path, nil
	case <-ctx.Done():
		if state.CompareAndSwap(pending, abandoned) {
			return "", ctx.Err() // the goroutine deletes the node
		}
		// The result is on its way: ours to clean up.
		if r := <-ch; r.path != "" {
			d.abandon(r.path)
		}
		return "", ctx.Err()
	}
}

// createProtected is the blocking create of protection mode (Curator's,
// ZOOKEEPER-1262): on a connection loss during the create, the node may or
// may not exist; we look for our GUID among the children before trying
// again. data is the node's data, written by the create itself, so a node
// found by our GUID carries it too. A missing parent (a container node the
// server reaped) is created, and so, once, is a missing prefix.
// A create the client could not send (zk.ErrNoServer) is tried again while
// the client reconnects (see again). On error, maybe reports that a node
// carrying our GUID may exist (a create in this session was cut by a
// connection loss).
func (d *Driver) createProtected(parent, guid, tag string, data []byte) (path string, maybe bool, err error) {
	name := parent + "/" + protectedPrefix + guid + tag + "-lock-"
	restored := false
	for rounds := 0; rounds < 5; {
		var p string
		p, err = d.conn.Create(name, data, zk.FlagEphemeral|zk.FlagSequence, d.acl)
		switch {
		case err == nil:
			return p, false, nil
		case errors.Is(err, zk.ErrNoNode):
			rounds++
			_, cerr := d.conn.CreateContainer(parent, nil, zk.FlagContainer, d.acl)
			if errors.Is(cerr, zk.ErrNoNode) && !restored {
				// The prefix itself is gone (deleted by a
				// client allowed to): create it again, once
				// (a try cut by a connection loss does not
				// count: again retries it).
				cerr = d.ensurePrefix(d.ctx)
				restored = cerr == nil || !(connLost(cerr) || errors.Is(cerr, zk.ErrNoServer))
			}
			if cerr != nil && !errors.Is(cerr, zk.ErrNodeExists) {
				if aerr := d.again(d.ctx, cerr, false); aerr != nil {
					return "", maybe, aerr
				}
			}
		case connLost(err):
			rounds++
			maybe = true
			p, found, ferr := d.findAfterLoss(parent, guid)
			if ferr != nil {
				return "", true, ferr
			}
			if found {
				return p, false, nil
			}
			// Not found, yet maybe stays set: the create may still
			// commit, or the server we asked may lag behind.
		case errors.Is(err, zk.ErrSessionExpired):
			// A new session: the node cannot exist. Try again.
			rounds++
			maybe = false
		default:
			// zk.ErrNoServer: the request was never sent. Tried
			// again until a full reconnect cycle has passed.
			if aerr := d.again(d.ctx, err, false); aerr != nil {
				return "", maybe, aerr
			}
		}
	}
	return "", maybe, err
}

// connLost reports an error that means the connection broke: the request
// may or may not have reached the server. The client library reports most
// as ErrConnectionClosed, but a write on a connection that just broke
// returns the network error itself.
//
// zk.ErrNoServer is not one: the request was never sent. See noServer for
// when it means that no server answers.
func connLost(err error) bool {
	var ne net.Error
	return errors.Is(err, zk.ErrConnectionClosed) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || errors.As(err, &ne)
}

// findAfterLoss is findByGUID after a connection loss: it tries again while
// the client reconnects (see again), and gives up once it has reached no
// server for a full reconnect cycle.
func (d *Driver) findAfterLoss(parent, guid string) (string, bool, error) {
	for {
		p, found, err := d.findByGUID(parent, guid)
		if err == nil {
			return p, found, nil
		}
		if aerr := d.again(d.ctx, err, false); aerr != nil {
			return "", false, aerr
		}
	}
}

// findByGUID looks for the lock node carrying guid under parent.
func (d *Driver) findByGUID(parent, guid string) (string, bool, error) {
	kids, _, err := d.conn.Children(parent)
	if errors.Is(err, zk.ErrNoNode) {
		return "", false, nil // no parent, so no node of ours
	}
	if err != nil {
		return "", false, err
	}
	for _, k := range kids {
		if strings.HasPrefix(k, protectedPrefix+guid) {
			return parent + "/" + k, true, nil
		}
	}
	return "", false, nil
}

// deleteByGUID deletes the lock node carrying guid, retrying until it is
// gone, the session that could own it has ended, or the driver is closed.
func (d *Driver) deleteByGUID(parent, guid string) {
	sid := d.conn.SessionID()
	for d.ctx.Err() == nil && d.conn.SessionID() == sid {
		p, found, err := d.findByGUID(parent, guid)
		switch {
		case err == nil && !found, errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrSessionExpired):
			return
		case err == nil:
			d.deleteNode(p)
			return
		}
		select {
		case <-d.ctx.Done():
		case <-time.After(retryPause):
		}
	}
}

// deleteNode deletes path (any version), retrying after connection losses;
// it gives up when the node or its session is gone or the driver is closed.
func (d *Driver) deleteNode(path string) {
	sid := d.conn.SessionID()
	for d.ctx.Err() == nil && d.conn.SessionID() == sid {
		err := d.conn.Delete(path, -1)
		if err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrClosing) {
			return
		}
		select {
		case <-d.ctx.Done():
		case <-time.After(retryPause):
		}
	}
}

// leave deletes our node at once, for a TryAcquire that found the lock
// held, so that no node of ours is left in the queue when it returns: one
// delete, bounded by ctx and leaveTimeout; if that does not succeed, the
// node is deleted in the background (abandon).
func (d *Driver) leave(ctx context.Context, node string) {
	ctx, cancel := context.WithTimeout(ctx, leaveTimeout)
	defer cancel()
	err := d.do(ctx, func() error { return d.conn.Delete(node, -1) })
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		d.abandon(node)
	}
}

// abandon deletes our node, for an acquire that failed or was cancelled
// after the create, or a release whose outcome is unknown: in the
// background, so that the caller returns at once, retrying until the node
// or its session is gone, or the driver is closed (Close waits for it; the
// end of the session deletes the node anyway).
func (d *Driver) abandon(node string) {
	d.bg.Go(func() { d.deleteNode(node) })
}

// position lists parent's children and judges our node's turn (see
// judge; k is our kind). Another node carrying our GUID (a create that
// committed after protection mode's search had missed it) is ours too: it
// is deleted, not waited for. queued is read's.
func (d *Driver) position(ctx context.Context, queued bool, parent, node string, k kind) (turn, error) {
	var kids []string
	err := d.read(ctx, queued, func() (err error) {
		kids, _, err = d.conn.Children(parent)
		return err
	})
	if err != nil {
		return turn{}, err
	}
	me := node[len(parent)+1:]
	guid := me[:min(len(me), len(protectedPrefix)+guidLen)]
	kids = slices.DeleteFunc(kids, func(k string) bool {
		if k != me && strings.HasPrefix(k, guid) {
			d.bg.Go(func() { d.deleteNode(parent + "/" + k) })
			return true
		}
		return false
	})
	return judge(kids, me, k), nil
}

// look lists key's queue (see position) and, at the same time, reads our
// node with a watch on it (see arm): two requests in flight together, one
// round trip. l is in the lease table before the read is sent, so that a
// deletion of the node after it is a loss. When our node is granted
// (t.granted: first in line, or a shared lease the rule grants), the read
// gives the lease its token (the node's czxid) and its anchor: the lease's
// TTL counts from when the read was sent, as the session cannot expire
// sooner than a session timeout after the server received it. A node gone
// between the listing and the read is not mine. queued is read's.
func (d *Driver) look(ctx context.Context, queued bool, parent string, l *lease, k kind) (t turn, err error) {
	type armed struct {
		czxid int64
		sent  time.Time
		err   error
	}
	ach := make(chan armed, 1)
	if !d.bg.Go(func() {
		for {
			czxid, sent, err := d.arm(l)
			if err != nil {
				if err = d.again(ctx, err, queued); err == nil {
					continue
				}
			}
			ach <- armed{czxid, sent, err}
			return
		}
	}) {
		return turn{}, backend.ErrClosed
	}
	t, err = d.position(ctx, queued, parent, l.node, k)
	if err != nil || !t.granted {
		return t, err
	}
	var a armed
	select {
	case a = <-ach:
	case <-ctx.Done():
		return turn{}, ctx.Err()
	}
	switch {
	case errors.Is(a.err, zk.ErrNoNode):
		return turn{}, nil // gone since the listing (session expired?)
	case a.err != nil:
		return turn{}, unavailable("reading the lock node", a.err)
	}
	d.leaseMu.Lock()
	lost := l.lossErr
	d.leaseMu.Unlock()
	if lost != nil {
		return turn{}, nil
	}
	l.token, l.anchor = uint64(a.czxid), a.sent
	return t, nil
}

// newLease makes the lease of our node, not yet granted: it is put in the
// lease table by the first look.
func (d *Driver) newLease(node string, ttl time.Duration) *lease {
	l := &lease{d: d, node: node, ttl: ttl}
	d.track(l)
	return l
}

// grant starts l's TTL: the driver gives the lock up itself when it runs
// out without a refresh.
func (l *lease) grant() *lease {
	l.mu.Lock()
	l.lapse = time.AfterFunc(l.ttl, l.expire)
	l.mu.Unlock()
	return l
}

// TryAcquire joins the queue and, unless granted at once, leaves it: when
// the lock is held, our node is deleted before TryAcquire returns (within
// leaveTimeout; otherwise in the background). Two round trips when the lock
// is free: the create, then the listing and the read of our node together.
// A shared request that finds the key held by shared leases of another
// Permits leaves too, and returns a *PermitsError.
func (d *Driver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	key, ttl, k := req.Key, req.TTL, kindOf(req)
	parent := d.parent(key)
	node, err := d.create(ctx, parent, k.tag(), holderData(req.Holder))
	if err != nil {
		return nil, d.acquireErr(ctx, err)
	}
	l := d.newLease(node, ttl)
	t, err := d.look(ctx, false, parent, l, k)
	switch {
	case err != nil:
		d.untrack(l)
		d.abandon(node)
		return nil, d.acquireErr(ctx, unavailable("listing the queue", err))
	case !t.mine:
		d.untrack(l)
		return nil, fmt.Errorf("%w: zookeeper: the lock node vanished (session expired?)", backend.ErrUnavailable)
	case t.mismatch != nil:
		d.untrack(l)
		d.leave(ctx, node)
		return nil, t.mismatch
	case !t.granted:
		d.untrack(l)
		d.leave(ctx, node)
		return nil, &backend.HeldError{}
	}
	return l.grant(), nil
}

// Acquire joins key's queue and waits until the grant rule grants our node:
// for an exclusive lease, until every node ahead of ours is gone, watching
// only its immediate predecessor; for a shared one, see judge for what it
// watches. On error or cancellation it returns at once, and our node is
// deleted in the background. Once its node exists, a waiter rides out
// connection losses and rounds of the client that reach no server: only a
// cut-off longer than the session timeout (plus cutOffMargin) ends its
// wait (see await and again). A shared request that finds the key held by
// shared leases of another Permits leaves the queue (its node deleted
// before it returns, as TryAcquire's) and returns a *PermitsError.
func (d *Driver) Acquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	key, ttl, k := req.Key, req.TTL, kindOf(req)
	parent := d.parent(key)
	node, err := d.create(ctx, parent, k.tag(), holderData(req.Holder))
	if err != nil {
		return nil, d.acquireErr(ctx, err)
	}
	l := d.newLease(node, ttl)
	fail := func(err error) (backend.Lease, error) {
		d.untrack(l)
		d.abandon(node)
		return nil, d.acquireErr(ctx, err)
	}
	for {
		t, err := d.look(ctx, true, parent, l, k)
		switch {
		case err != nil:
			return fail(unavailable("listing the queue", err))
		case !t.mine:
			d.untrack(l)
			return nil, fmt.Errorf("%w: zookeeper: the waiter's node vanished while queued (session expired?)", backend.ErrUnavailable)
		case t.mismatch != nil:
			d.untrack(l)
			d.leave(ctx, node)
			return nil, t.mismatch
		case t.granted:
			return l.grant(), nil
		}
		// Watches that a missing node cannot leave behind: GetW or
		// ChildrenW, not ExistsW, which would wait for its creation.
		ev, stop, ready, err := d.watchTurn(ctx, parent, t)
		if ready {
			continue // gone already
		}
		if err != nil {
			return fail(unavailable("watching the queue", err))
		}
		err = d.await(ctx, ev)
		stop()
		if err != nil {
			return fail(err)
		}
	}
}

// await waits for ev, the watch of a waiter (see watchTurn), to fire (a
// node it watches was deleted, or the watch ended),
// until ctx ends or the session has been cut off for longer than its
// timeout (plus cutOffMargin, see cutOff): a waiter that cannot know
// whether its node still exists gives up with ErrUnavailable instead of
// waiting for the ensemble forever.
func (d *Driver) await(ctx context.Context, ev <-chan zk.Event) error {
	for {
		left, changed, err := d.cutOff()
		if err != nil {
			return err
		}
		if done, err := d.awaitChange(ctx, ev, changed, left); done {
			return err
		}
	}
}

// awaitChange is one wait of await: until ev fires or ctx ends (done), or
// the connection's state changes or the time left runs out (not done: look
// again). left 0 means no time limit.
func (d *Driver) awaitChange(ctx context.Context, ev <-chan zk.Event, changed <-chan struct{}, left time.Duration) (done bool, err error) {
	var expiry <-chan time.Time
	if left > 0 {
		t := time.NewTimer(left)
		defer t.Stop()
		expiry = t.C
	}
	select {
	case <-ev:
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	case <-changed:
	case <-expiry:
	}
	return false, nil
}

// acquireErr is the error of an acquire that failed with err. When ctx
// ended it matches ErrNotAcquired and ctx.Err(); it also matches
// ErrUnavailable when the deadline passed while a request went unanswered
// (the ensemble did not answer in time), but not for a plain cancellation
// or a deadline reached while queued.
func (d *Driver) acquireErr(ctx context.Context, err error) error {
	cerr := ctx.Err()
	switch {
	case cerr == nil || !errors.Is(err, cerr):
		return err
	case cerr == context.DeadlineExceeded && errors.Is(err, backend.ErrUnavailable):
		return fmt.Errorf("%w: %w", backend.ErrNotAcquired, err)
	}
	return fmt.Errorf("%w: %w", backend.ErrNotAcquired, cerr)
}

// unavailable wraps a ZooKeeper client error.
func unavailable(doing string, err error) error {
	return fmt.Errorf("%w: zookeeper: %s: %w", backend.ErrUnavailable, doing, err)
}
