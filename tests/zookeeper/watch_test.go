package zookeeper_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// The zookeeper Driver's backend.ChangeWatcher beyond what the conformance
// suite's RunInspect checks (a grant and a release, on a key nobody locked
// before): a directory the server reaps and one made again, a connection
// lost while watching, the session's expiry, Close, stop; and the holder
// description's corner cases.

// watchKey starts l's change watch on key; stop is called when t ends.
func watchKey(t *testing.T, l *dlock.Locker, key string) (<-chan struct{}, func()) {
	t.Helper()
	cw, ok := driver.DriverOf(l).(backend.ChangeWatcher)
	if !ok {
		t.Fatal("the zookeeper Driver is not a backend.ChangeWatcher")
	}
	ch, stop, err := cw.WatchChanges(t.Context(), key)
	if err != nil {
		t.Fatalf("WatchChanges: %v", err)
	}
	t.Cleanup(stop)
	return ch, stop
}

// expectChange waits for a receive on ch, after what.
func expectChange(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("the watch ended (channel closed), want a receive after %s", what)
		}
	case <-time.After(slack):
		t.Fatalf("nothing received within %v of %s", slack, what)
	}
}

// expectEnd waits for ch to be closed (pending receives are skipped).
func expectEnd(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	end := time.After(slack)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-end:
			t.Fatalf("the watch did not end within %v of %s", slack, what)
		}
	}
}

// settle drains ch until it has been quiet for a moment: the signals of a
// burst (a directory created, then a node in it) are consumed before the
// next change is checked. It fails if ch is closed.
func settle(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatal("the watch ended (channel closed)")
			}
		case <-time.After(300 * time.Millisecond):
			return
		}
	}
}

// TestWatchChangesDirectoryReaped: the key's directory is deleted while
// watched (as the server reaps an empty container node) and made again by
// the next acquire: the watch reports both, goes back to watching the
// children, and reports the release after.
func TestWatchChangesDirectoryReaped(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	w, b := newLocker(t, srv, nil), newLocker(t, srv, nil)
	key := uniqueKey(t)
	prime(t, b, key) // the directory exists, empty
	ch, _ := watchKey(t, w, key)
	if err := admin.Delete(parent(key), -1); err != nil {
		t.Fatalf("deleting the empty key directory: %v", err)
	}
	expectChange(t, ch, "the directory's deletion")
	le, err := b.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	expectChange(t, ch, "a grant that made the directory again")
	settle(t, ch)
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	expectChange(t, ch, "the release")
}

// TestWatchChangesThroughLostConnection: a grant made while the watcher is
// cut off from the server is reported once it reconnects (the client sets
// its watches again, the server reports what changed since), and the
// watch goes on.
func TestWatchChangesThroughLostConnection(t *testing.T) {
	reconnects(t)
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	cut := &cutter{}
	w := newLocker(t, srv, &zookeeper.Options{Dialer: cut.dial})
	b := newLocker(t, srv, nil)
	key := uniqueKey(t)
	prime(t, b, key)
	ch, _ := watchKey(t, w, key)
	cut.partition(true)
	defer cut.partition(false)
	awaitNoSession(t, w)
	le, err := b.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-ch:
		t.Fatalf("received while cut off (closed: %v), want nothing until reconnected", !ok)
	case <-time.After(300 * time.Millisecond):
	}
	cut.partition(false)
	expectChange(t, ch, "a grant made while the watcher was cut off")
	settle(t, ch)
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	expectChange(t, ch, "a release after the reconnect")
}

// TestWatchChangesSessionExpires: when the watcher's session expires, the
// server forgets its watches and the channel is closed; a new watch (on
// the client's new session) works.
func TestWatchChangesSessionExpires(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	spy := &sessionSpy{}
	w := newLocker(t, srv, &zookeeper.Options{Dialer: spy.dial})
	b := newLocker(t, srv, nil)
	key := uniqueKey(t)
	ch, _ := watchKey(t, w, key)
	killSession(t, srv[0], zkConnOf(t, w).SessionID(), spy.password())
	expectEnd(t, ch, "the session's expiry")

	awaitSession(t, w)
	ch, _ = watchKey(t, w, key)
	le, err := b.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	expectChange(t, ch, "a grant, watched on the new session")
	_ = le.Release(t.Context())
}

// TestWatchChangesEndsWithClose: closing the Locker ends its watches.
func TestWatchChangesEndsWithClose(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	w, err := openLocker(t.Context(), srv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := watchKey(t, w, uniqueKey(t))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	expectEnd(t, ch, "Close")
	// stop, called when t ends, returns at once.
}

// TestWatchChangesStop: stop ends the watch's goroutine before it returns,
// and changes after it neither reach the channel nor panic (the client
// library still delivers the server's event to the stopped watch).
func TestWatchChangesStop(t *testing.T) {
	// Not parallel: the goroutine check counts every goroutine of the
	// process.
	srv := servers.ZooKeeper(t, 1).Servers()
	w, b := newLocker(t, srv, nil), newLocker(t, srv, nil)
	key := uniqueKey(t)
	prime(t, b, key)
	before := goleak.IgnoreCurrent()
	cw := driver.DriverOf(w).(backend.ChangeWatcher)
	for _, k := range []string{key, uniqueKey(t)} { // a directory, and none
		ch, stop, err := cw.WatchChanges(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		stop()
		if err := goleak.Find(before); err != nil {
			t.Fatalf("goroutines left after stop: %v", err)
		}
		le, err := b.TryAcquire(t.Context(), k, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case _, ok := <-ch:
			t.Fatalf("received after stop (closed: %v)", !ok)
		case <-time.After(500 * time.Millisecond):
		}
	}
	// The Locker still works, its other watches too.
	ch, _ := watchKey(t, w, key)
	le, err := b.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	expectChange(t, ch, "a grant")
	_ = le.Release(t.Context())
}

// TestWatchChangesBadKey: a bad key is refused before any I/O.
func TestWatchChangesBadKey(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	cw := driver.DriverOf(newLocker(t, srv, nil)).(backend.ChangeWatcher)
	for _, k := range []string{"", strings.Repeat("k", dlock.MaxKeyLen+1), "a\x00b"} {
		if _, _, err := cw.WatchChanges(t.Context(), k); !errors.Is(err, dlock.ErrInvalidKey) {
			t.Errorf("WatchChanges(%.20q): %v, want ErrInvalidKey", k, err)
		}
	}
}

// TestHolderPlantedData: the holder description is the lock node's data;
// data written there by another client (the default ACL lets anyone) is
// shown only if it is a valid description, so that it cannot reach a
// terminal or make Inspect read much.
func TestHolderPlantedData(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	a, b := newLocker(t, srv, nil), newLocker(t, srv, nil)
	key := uniqueKey(t)
	le, err := b.Acquire(t.Context(), key, &dlock.AcquireOptions{Holder: "b/1"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = le.Release(t.Context()) }()
	_, node := holderNode(t, admin, zookeeper.DefaultPrefix, key)
	if data, _, err := admin.Get(node); err != nil || string(data) != "b/1" {
		t.Fatalf("the lock node's data = %q, %v, want the holder description", data, err)
	}
	for _, tc := range []struct{ data, want string }{
		{"\x1b[2J", ""},
		{strings.Repeat("h", backend.MaxHolderLen+1), ""},
		{"\xff", ""},
		{"", ""},
		{"someone else", "someone else"},
	} {
		if _, err := admin.Set(node, []byte(tc.data), -1); err != nil {
			t.Fatal(err)
		}
		info, err := a.Inspect(t.Context(), key)
		if err != nil || !info.Held || info.Holder != tc.want || info.Token != le.Token() {
			t.Errorf("Inspect with the node's data %.20q = %+v, %v; want held, token %d, holder %q", tc.data, info, err, le.Token(), tc.want)
		}
	}
}

// TestHolderThroughLostCreate: the create's data is the holder
// description, so the node protection mode finds after a connection lost
// during the create carries it too.
func TestHolderThroughLostCreate(t *testing.T) {
	f := newCutFixture(t)
	f.cut.arm()
	le, err := f.a.Acquire(t.Context(), f.key, &dlock.AcquireOptions{Holder: "a, across a cut"})
	if f.cut.cutCount() != 1 {
		t.Fatal("the connection was not cut during the create")
	}
	if err != nil {
		t.Fatal(err)
	}
	if info, err := f.b.Inspect(t.Context(), f.key); err != nil || info.Holder != "a, across a cut" {
		t.Errorf("Inspect = %+v, %v, want the holder description", info, err)
	}
	_ = le.Release(t.Context())
}

// sessionSpy is a zk.Dialer that records the session password in the
// server's connect response, for killSession.
type sessionSpy struct {
	mu     sync.Mutex
	passwd []byte
}

func (s *sessionSpy) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &spyConn{Conn: c, s: s}, nil
}

func (s *sessionSpy) password() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.passwd
}

// spyConn reads the connect response, the first frame the server sends:
// length, protocolVersion, timeOut, sessionId (int64), passwd (length and
// bytes). The client reads a connection from one goroutine at a time.
type spyConn struct {
	net.Conn
	s    *sessionSpy
	head []byte
	done bool
}

func (c *spyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		c.head = append(c.head, p[:n]...)
		if len(c.head) >= 24 {
			if l := int(int32(binary.BigEndian.Uint32(c.head[20:24]))); l >= 0 && len(c.head) >= 24+l {
				c.done = true
				c.s.mu.Lock()
				c.s.passwd = append([]byte(nil), c.head[24:24+l]...)
				c.s.mu.Unlock()
			}
		}
	}
	return n, err
}

// killSession ends the session id (password passwd) on the server at addr,
// as Curator's KillSession does: a second connection takes the session
// over (the server closes the first one) and closes it. The client of the
// session then learns, on reconnecting, that it expired.
func killSession(t *testing.T, addr string, id int64, passwd []byte) {
	t.Helper()
	if len(passwd) == 0 {
		t.Fatal("no session password recorded")
	}
	c, err := net.DialTimeout("tcp", addr, slack)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(slack))
	frame := func(body []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	readFrame := func() []byte {
		var n [4]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			t.Fatalf("killSession: reading: %v", err)
		}
		b := make([]byte, binary.BigEndian.Uint32(n[:]))
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("killSession: reading: %v", err)
		}
		return b
	}
	// ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId,
	// passwd, readOnly.
	var req []byte
	req = binary.BigEndian.AppendUint32(req, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, uint32(testSession/time.Millisecond))
	req = binary.BigEndian.AppendUint64(req, uint64(id))
	req = binary.BigEndian.AppendUint32(req, uint32(len(passwd)))
	req = append(req, passwd...)
	req = append(req, 0)
	if _, err := c.Write(frame(req)); err != nil {
		t.Fatal(err)
	}
	if resp := readFrame(); len(resp) < 16 || int64(binary.BigEndian.Uint64(resp[8:16])) != id {
		t.Fatalf("killSession: the server did not hand session %#x over: %x", id, resp)
	}
	// closeSession: xid 1, type -11.
	closeSession := int32(-11)
	var cl []byte
	cl = binary.BigEndian.AppendUint32(cl, 1)
	cl = binary.BigEndian.AppendUint32(cl, uint32(closeSession))
	if _, err := c.Write(frame(cl)); err != nil {
		t.Fatal(err)
	}
	if resp := readFrame(); len(resp) < 16 || binary.BigEndian.Uint32(resp[12:16]) != 0 {
		t.Fatalf("killSession: closeSession answered %x", resp)
	}
}
