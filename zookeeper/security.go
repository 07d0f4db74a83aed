package zookeeper

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/backend"
)

// permLetters are ZooKeeper's permission letters (zkCli's "cdrwa"), in the
// order of zk.PermRead, PermWrite, PermCreate, PermDelete, PermAdmin.
const permLetters = "rwcda"

// checkACL refuses an ACL the server would refuse or that could not work,
// before any I/O: an entry without a scheme or id (the auth scheme's id is
// empty), with no permission or one zk does not define, or of the auth
// scheme when there are no credentials (auth means "the identities the
// creator authenticated as").
func checkACL(acl []zk.ACL, auth string) error {
	for _, a := range acl {
		switch {
		case a.Scheme == "":
			return fmt.Errorf("%w: zookeeper: ACL %s: no scheme", backend.ErrInvalidConfig, formatACL(a))
		case a.Perms <= 0 || a.Perms&^zk.PermAll != 0:
			return fmt.Errorf("%w: zookeeper: ACL %s: permissions %#x: want a non-empty subset of zk.PermAll", backend.ErrInvalidConfig, formatACL(a), a.Perms)
		case a.Scheme == "auth" && auth == "":
			return fmt.Errorf("%w: zookeeper: ACL %s: the auth scheme needs credentials (Auth)", backend.ErrInvalidConfig, formatACL(a))
		case a.Scheme != "auth" && a.ID == "":
			return fmt.Errorf("%w: zookeeper: ACL %s: no id", backend.ErrInvalidConfig, formatACL(a))
		case a.Scheme == "digest" && strings.Contains(a.ID, " "):
			// url.ParseQuery turns a '+' of the base64 digest into a space.
			return fmt.Errorf("%w: zookeeper: ACL %s: a space in a digest id (write a '+' of the digest as %%2B in a URL)", backend.ErrInvalidConfig, formatACL(a))
		}
	}
	return nil
}

// parseACL parses the URL parameter acl: entries scheme:id:perms separated
// by commas, as zkCli writes them (digest:alice:<base64 of SHA-1 of
// alice:password>:cdrwa, world:anyone:r, auth::cdrwa). The id is what lies
// between the first and the last colon, so a digest id keeps its own.
func parseACL(v string) ([]zk.ACL, error) {
	var acl []zk.ACL
	for _, e := range strings.Split(v, ",") {
		i, j := strings.Index(e, ":"), strings.LastIndex(e, ":")
		if i < 0 || i == j {
			return nil, fmt.Errorf("%w: zookeeper: parameter acl: entry %q: want scheme:id:perms, such as digest:alice:<digest>:cdrwa or world:anyone:r", backend.ErrInvalidConfig, e)
		}
		a := zk.ACL{Scheme: e[:i], ID: e[i+1 : j]}
		for _, c := range e[j+1:] {
			k := strings.IndexRune(permLetters, c)
			if k < 0 || a.Perms&(1<<k) != 0 {
				return nil, fmt.Errorf("%w: zookeeper: parameter acl: entry %q: permissions %q: want letters among cdrwa, each once", backend.ErrInvalidConfig, e, e[j+1:])
			}
			a.Perms |= 1 << k
		}
		acl = append(acl, a)
	}
	return acl, nil
}

// formatACL writes a as zkCli does (scheme:id:perms).
func formatACL(a zk.ACL) string {
	var b strings.Builder
	b.WriteString(a.Scheme + ":" + a.ID + ":")
	for _, c := range "cdrwa" {
		if a.Perms&(1<<strings.IndexRune(permLetters, c)) != 0 {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// worldWritable reports whether acl lets every client (world:anyone)
// create or delete children or change the ACL.
func worldWritable(acl []zk.ACL) bool {
	for _, a := range acl {
		if a.Scheme == "world" && a.ID == "anyone" && a.Perms&(zk.PermCreate|zk.PermDelete|zk.PermAdmin) != 0 {
			return true
		}
	}
	return false
}

// remote returns the first server that is not on the loopback network, or
// "" if all are.
func remote(servers []string) string {
	for _, s := range servers {
		h, _, _ := net.SplitHostPort(s)
		if ip := net.ParseIP(h); h != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return s
		}
	}
	return ""
}

// warnTransport logs, once at open, what the transport gives away: digest
// credentials sent in plaintext to a server off the loopback network, or a
// TLS configuration that does not verify the servers.
func (d *Driver) warnTransport(servers []string, o *Options) {
	if o.TLS != nil && o.TLS.InsecureSkipVerify {
		d.log.Warn("dlock/zookeeper: TLS without verification of the servers' certificates (InsecureSkipVerify): " +
			"anyone on the path can pose as the ensemble")
	}
	if s := remote(servers); o.Auth != "" && o.TLS == nil && s != "" {
		d.log.Warn("dlock/zookeeper: the digest password is sent in plaintext (no TLS): use zks:// or Options.TLS", "server", s)
	}
}

// checkPrefixACL logs, once at open, a prefix that leaves the locks open:
// with credentials or an ACL, a prefix node whose ACL lets every client
// create, delete or change the ACL (it was made by someone else, or the
// ACL given says so), through which any client can delete an idle key
// directory or take the prefix over with SetACL, failing every acquire;
// without either, a server off the loopback network (every client that
// reaches it can delete any lock node). The common development case, no
// credentials on loopback, stays quiet.
func (d *Driver) checkPrefixACL(ctx context.Context, servers []string, o *Options) {
	if o.Auth == "" && len(o.ACL) == 0 {
		if s := remote(servers); s != "" {
			d.log.Warn("dlock/zookeeper: no credentials and no ACL: every client that reaches the ensemble can delete "+
				"lock nodes and take locks it does not hold; set Auth (user:password in the URL) or ACL", "server", s)
		}
		return
	}
	var acl []zk.ACL
	err := d.read(ctx, false, func() (err error) {
		acl, _, err = d.conn.GetACL(d.prefix)
		return err
	})
	if err != nil {
		d.log.Debug("dlock/zookeeper: could not read the prefix's ACL", "prefix", d.prefix, "err", err)
		return
	}
	if worldWritable(acl) {
		entries := make([]string, len(acl))
		for i, a := range acl {
			entries[i] = formatACL(a)
		}
		d.log.Warn("dlock/zookeeper: the prefix is world-writable: any client can delete its idle key directories, "+
			"or take it over with SetACL and fail every acquire; restrict its ACL (setAcl) or use a prefix of your own",
			"prefix", d.prefix, "acl", strings.Join(entries, ","))
	}
}

// tlsDialer wraps dial with a TLS handshake (cfg; ServerName defaults to
// the host dialled), bounded by the dial's timeout.
func tlsDialer(dial zk.Dialer, cfg *tls.Config) zk.Dialer {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := dial(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		tc := cfg
		if tc.ServerName == "" {
			tc = cfg.Clone()
			tc.ServerName, _, _ = net.SplitHostPort(addr)
		}
		t := tls.Client(c, tc)
		_ = c.SetDeadline(time.Now().Add(timeout))
		if err := t.Handshake(); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("zookeeper: TLS handshake with %s: %w", addr, err)
		}
		_ = c.SetDeadline(time.Time{})
		return t, nil
	}
}
