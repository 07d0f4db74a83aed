package redlock_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
)

// countingListener listens on 127.0.0.1 and counts the connections made to
// it, to show that a check happened before any I/O.
func countingListener(t *testing.T) (port int, conns *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns = new(atomic.Int64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return ln.Addr().(*net.TCPAddr).Port, conns
}

// alias is one server listed twice, as a and b, with a third node.
type alias struct {
	name  string
	nodes [3]string
	a, b  string
}

func aliases(p int) []alias {
	ps := strconv.Itoa(p)
	other := "127.0.0.1:" + strconv.Itoa(p+1)
	mk := func(name, a, b string, bLast bool) alias {
		if bLast {
			return alias{name, [3]string{a, other, b}, a, b}
		}
		return alias{name, [3]string{a, b, other}, a, b}
	}
	return []alias{
		mk("port with a leading zero", "127.0.0.1:"+ps, "127.0.0.1:0"+ps, false),
		mk("localhost for 127.0.0.1", "127.0.0.1:"+ps, "localhost:"+ps, true),
		mk("localhost spelt otherwise", "LocalHost.:"+ps, "127.0.0.1:"+ps, false),
		mk("localhost for ::1", "[::1]:"+ps, "localhost:"+ps, false),
		mk("IPv4-mapped IPv6", "[::ffff:127.0.0.1]:"+ps, "127.0.0.1:"+ps, true),
	}
}

// checkSameServerErr requires ErrInvalidConfig naming both spellings.
func checkSameServerErr(t *testing.T, err error, a, b string) {
	t.Helper()
	if !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	if !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), b) {
		t.Errorf("err = %v; want it to name both %s and %s", err, a, b)
	}
	t.Log(err)
}

// TestSameServerTwiceClients: New refuses clients that reach one server
// under two spellings of its address, or on two database numbers, naming
// both, before any I/O (nothing connects to the listener behind them).
func TestSameServerTwiceClients(t *testing.T) {
	p, conns := countingListener(t)
	newClient := func(addr string, db int) goredis.UniversalClient {
		c := goredis.NewClient(&goredis.Options{Addr: addr, DB: db, ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	for _, al := range aliases(p) {
		t.Run(al.name, func(t *testing.T) {
			cs := make([]goredis.UniversalClient, len(al.nodes))
			for i, a := range al.nodes {
				cs[i] = newClient(a, 0)
			}
			_, err := redlock.NewDriver(t.Context(), cs, nil)
			checkSameServerErr(t, err, al.a, al.b)
		})
	}
	t.Run("two databases", func(t *testing.T) {
		a := "127.0.0.1:" + strconv.Itoa(p)
		cs := []goredis.UniversalClient{newClient(a, 0), newClient(a, 1), newClient("127.0.0.1:"+strconv.Itoa(p+1), 0)}
		_, err := redlock.NewDriver(t.Context(), cs, nil)
		checkSameServerErr(t, err, "node 0", "node 1")
	})
	t.Run("two databases, localhost", func(t *testing.T) {
		cs := []goredis.UniversalClient{newClient("127.0.0.1:"+strconv.Itoa(p+1), 0), newClient("127.0.0.1:"+strconv.Itoa(p), 3), newClient("localhost:"+strconv.Itoa(p), 5)}
		_, err := redlock.New(t.Context(), cs, nil)
		checkSameServerErr(t, err, "localhost:"+strconv.Itoa(p), "127.0.0.1:"+strconv.Itoa(p))
	})
	if n := conns.Load(); n != 0 {
		t.Errorf("%d connections to the server before the error; want the check before any I/O", n)
	}
}

// TestSameServerTwiceURL: the same through dlock.Open URLs.
func TestSameServerTwiceURL(t *testing.T) {
	p, conns := countingListener(t)
	for _, al := range aliases(p) {
		if strings.Contains(al.a+al.b, "[") {
			continue // a URL cannot hold IPv6 literals in a list (url.Parse refuses them)
		}
		t.Run(al.name, func(t *testing.T) {
			_, err := dlock.Open(t.Context(), "redlock://"+strings.Join(al.nodes[:], ",")+"/2?ttl=1s")
			checkSameServerErr(t, err, al.a, al.b)
		})
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("%d connections to the server before the error; want the check before any I/O", n)
	}
}

// TestSameServerTwiceByName: a host name that resolves to another node's
// address is the same server (the check resolves names in New). It uses
// this machine's host name, which resolves locally on most systems.
func TestSameServerTwiceByName(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skipf("no host name: %v", err)
	}
	ips, err := net.DefaultResolver.LookupIPAddr(t.Context(), host)
	if err != nil || len(ips) == 0 {
		t.Skipf("this machine's host name %q does not resolve (%v); nothing to test with", host, err)
	}
	p, conns := countingListener(t)
	ps := strconv.Itoa(p)
	byIP := net.JoinHostPort(ips[0].IP.String(), ps)
	byName := net.JoinHostPort(host, ps)
	u := "redlock://" + byIP + ",127.0.0.1:" + strconv.Itoa(p+1) + "," + byName
	_, err = dlock.Open(t.Context(), u)
	checkSameServerErr(t, err, byIP, byName)
	if n := conns.Load(); n != 0 {
		t.Errorf("%d connections to the server before the error; want the check before any connection", n)
	}
}

// TestDifferentServersNotRefused: clients whose Addr does not say where
// they connect are not compared by it: Sentinel failover clients (all
// "FailoverClient") for three masters, and clients with a custom Dialer
// that share an Addr.
func TestDifferentServersNotRefused(t *testing.T) {
	t.Run("failover clients", func(t *testing.T) {
		cs := make([]goredis.UniversalClient, 3)
		for i := range cs {
			c := goredis.NewFailoverClient(&goredis.FailoverOptions{
				MasterName:            "master" + strconv.Itoa(i),
				SentinelAddrs:         []string{"127.0.0.1:" + strconv.Itoa(1+i)}, // nothing listens
				ContextTimeoutEnabled: true,
				MaxRetries:            -1,
			})
			t.Cleanup(func() { _ = c.Close() })
			cs[i] = c
		}
		d, err := redlock.NewDriver(t.Context(), cs, nil)
		if err != nil {
			t.Fatalf("three failover clients for three masters: %v; want them accepted", err)
		}
		_ = d.Close()
	})
	t.Run("custom dialers", func(t *testing.T) {
		cs := make([]goredis.UniversalClient, 3)
		for i := range cs {
			target := "127.0.0.1:" + strconv.Itoa(1+i) // nothing listens
			c := goredis.NewClient(&goredis.Options{
				Addr: "redis.internal:6379", // the same for all: not where they connect
				Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, network, target)
				},
				ContextTimeoutEnabled: true,
				MaxRetries:            -1,
			})
			t.Cleanup(func() { _ = c.Close() })
			cs[i] = c
		}
		d, err := redlock.NewDriver(t.Context(), cs, nil)
		if err != nil {
			t.Fatalf("three clients with custom dialers and one Addr: %v; want them accepted", err)
		}
		_ = d.Close()
	})
}

// TestSameServerCheckCancelled: when ctx ends before the nodes' host names
// are resolved, New fails with ErrUnavailable and ctx.Err(), instead of
// comparing the names as written.
func TestSameServerCheckCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	cs := make([]goredis.UniversalClient, 3)
	for i := range cs {
		c := goredis.NewClient(&goredis.Options{Addr: "node" + strconv.Itoa(i) + ".example.test:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	d, err := redlock.NewDriver(ctx, cs, nil)
	if err == nil {
		_ = d.Close()
		t.Fatal("New with a cancelled ctx and host names to resolve succeeded")
	}
	if !errors.Is(err, context.Canceled) || !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("err = %v; want it to wrap context.Canceled and ErrUnavailable", err)
	}
	t.Log(err)
}
