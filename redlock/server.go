package redlock

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
)

// lookupTimeout bounds the name lookups of New's same-server check.
const lookupTimeout = 2 * time.Second

// server is a node's address as New compares it with the others': one
// server must not count as two votes.
type server struct {
	node  int
	given string   // the address as configured, for errors
	db    int      // the database number, for errors (it does not tell servers apart)
	ids   []string // the host:port forms it is known by: IPs, ports as numbers
	name  string   // a host name to resolve ("" if none)
	port  string   // the port, as a number where it is one
}

// plainDialer reports whether a client with options o connects where
// o.Network and o.Addr say: go-redis's own dialer, not a Sentinel failover
// client (whose Addr is "FailoverClient" and whose dialer asks the
// Sentinels) nor a custom Dialer (which may connect anywhere). Only such
// clients' addresses are compared.
func plainDialer(o *goredis.Options) bool {
	if o.Addr == "FailoverClient" {
		return false
	}
	if o.Dialer == nil {
		return true
	}
	// A client without a Dialer gets go-redis's own, a closure made by
	// goredis.NewDialer: its function's name (inlined or not) is the
	// only way to tell it from a custom one. A name not recognised counts
	// as custom: the client is then not compared, never wrongly refused.
	// The closure's options cannot be read, so a caller's Dialer built by
	// goredis.NewDialer from other options (dialing another Addr) passes
	// for the default: its client is compared by o.Addr, not by the
	// address it dials (doc.go says so).
	f := runtime.FuncForPC(reflect.ValueOf(o.Dialer).Pointer())
	return f != nil && strings.HasPrefix(f.Name(), "github.com/redis/go-redis/v9.") && strings.Contains(f.Name(), "NewDialer.func")
}

// loopback is what "localhost" (and the unspecified address, which a dial
// reaches through the loopback interface) stands for.
var loopback = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}

// parseServer reads the address a client dials, without I/O: IP literals in
// their canonical form (an IPv4-mapped IPv6 address as IPv4), "localhost" as
// the loopback addresses, ports as numbers (so 026380 is 26380), other host
// names lowercased, to be resolved by resolve. The database number is not
// part of a server's identity.
func parseServer(node int, network, addr string, db int) server {
	s := server{node: node, given: addr, db: db}
	if network == "unix" {
		s.ids = []string{"unix:" + filepath.Clean(addr)}
		return s
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		// The client cannot dial it either; compare it as written.
		s.ids = []string{strings.ToLower(addr)}
		return s
	}
	if p, err := strconv.ParseUint(port, 10, 16); err == nil {
		port = strconv.FormatUint(p, 10)
	} else {
		port = strings.ToLower(port) // a service name: resolve looks it up
	}
	s.port = port
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip.Unmap()}
		if ip.IsUnspecified() {
			ips = loopback
		}
	} else if host == "" || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		ips = loopback // RFC 6761: no lookup needed
	} else {
		s.name = host
		s.ids = []string{net.JoinHostPort(host, port)}
	}
	for _, ip := range ips {
		s.ids = append(s.ids, net.JoinHostPort(ip.String(), port))
	}
	return s
}

// needsLookup reports whether resolve has anything to look up.
func (s *server) needsLookup() bool {
	_, err := strconv.ParseUint(s.port, 10, 16)
	return s.name != "" || (s.port != "" && err != nil)
}

// resolve adds the addresses that s's host name resolves to, and its
// service name's port number. A name that does not resolve (now) is
// compared as written.
func (s *server) resolve(ctx context.Context) {
	port := s.port
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		p, err := net.DefaultResolver.LookupPort(ctx, "tcp", port)
		if err != nil {
			return
		}
		port = strconv.Itoa(p)
		if s.name == "" {
			// The host was an IP or localhost: the same addresses,
			// with the port as a number.
			for _, id := range s.ids {
				h, _, _ := net.SplitHostPort(id)
				s.ids = append(s.ids, net.JoinHostPort(h, port))
			}
			return
		}
		s.ids = append(s.ids, net.JoinHostPort(s.name, port))
	}
	if s.name == "" {
		return
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", s.name)
	if err != nil {
		return
	}
	for _, ip := range ips {
		s.ids = append(s.ids, net.JoinHostPort(ip.Unmap().String(), port))
	}
}

// sameServer returns an error wrapping backend.ErrInvalidConfig, naming
// both, if two of ss are known by a common address.
func sameServer(ss []server) error {
	seen := map[string]int{}
	for k, s := range ss {
		for _, id := range s.ids {
			if j, dup := seen[id]; dup && j != k {
				return fmt.Errorf("%w: redlock: node %d (%s) and node %d (%s) are the same server (%s); it would vote twice",
					backend.ErrInvalidConfig, ss[j].node, ss[j].describe(s), s.node, s.describe(ss[j]), id)
			}
			seen[id] = k
		}
	}
	return nil
}

// describe is s's address for an error about s and other: with its
// database number where theirs differ.
func (s *server) describe(other server) string {
	if s.db != other.db {
		return s.given + " db " + strconv.Itoa(s.db)
	}
	return s.given
}

// checkServers refuses nodes that are one server under two addresses: first
// without I/O (IP literals, localhost, port numbers), then after resolving
// host names (a DNS lookup for names other than localhost, bounded by ctx
// and lookupTimeout). If ctx ends before the lookups are done, it fails
// with an error wrapping backend.ErrUnavailable and ctx.Err(): the names
// could not be compared. (A lookup that fails, or lookupTimeout passing,
// leaves a name compared as written.)
func checkServers(ctx context.Context, ss []server) error {
	if err := sameServer(ss); err != nil {
		return err
	}
	lookup := false
	for _, s := range ss {
		lookup = lookup || s.needsLookup()
	}
	if !lookup {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	for i := range ss {
		if ctx.Err() != nil {
			break
		}
		if ss[i].needsLookup() {
			ss[i].resolve(lctx)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: redlock: resolving the nodes' host names to check that no server is given twice: %w", backend.ErrUnavailable, err)
	}
	return sameServer(ss)
}
