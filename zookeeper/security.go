package zookeeper

import (
	"context"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/backend"
)

// permLetters are ZooKeeper's permission letters (zkCli's "cdrwa"), in the
// order of zk.PermRead, PermWrite, PermCreate, PermDelete, PermAdmin.
const permLetters = "rwcda"

// checkACL refuses an ACL the server would refuse or that could not work,
// before any I/O: an entry without a scheme or an id, with an id not of
// its scheme's form (world: anyone; digest: user:<base64 of the SHA-1 of
// user:password>; ip: an address or CIDR; x509: a name; the schemes of
// other providers, such as sasl, are the server's to check), with no
// permission or one zk does not define, or of the auth scheme when there
// are no credentials (auth means "the identities the creator
// authenticated as"); or an ACL that gives this Locker (auth) no read,
// create and delete (see mayUse). Errors name an entry by its index and
// scheme, never its text: a password typed where the digest belongs is
// not echoed.
func checkACL(acl []zk.ACL, auth string) error {
	for i, a := range acl {
		if err := checkEntry(a, auth); err != nil {
			scheme := a.Scheme
			if !slices.Contains(schemes, scheme) {
				scheme = "unknown scheme"
			}
			return fmt.Errorf("%w: zookeeper: ACL entry %d (%s): %s", backend.ErrInvalidConfig, i+1, scheme, err)
		}
	}
	if len(acl) > 0 && !mayUse(acl, auth) {
		return fmt.Errorf("%w: zookeeper: ACL: no entry gives %s read, create and delete, which it needs on the nodes it creates "+
			"(add one for it, such as auth::cdrwa with Auth, or its digest)", backend.ErrInvalidConfig, identity(auth))
	}
	return nil
}

// schemes are the ACL schemes of ZooKeeper's authentication providers.
var schemes = []string{"world", "auth", "digest", "ip", "x509"}

// checkEntry is checkACL's check of one entry; its error says what is
// wrong without the entry's text.
func checkEntry(a zk.ACL, auth string) error {
	if a.Perms <= 0 || a.Perms&^zk.PermAll != 0 {
		return fmt.Errorf("permissions %#x: want a non-empty subset of zk.PermAll", a.Perms)
	}
	switch a.Scheme {
	case "world":
		if a.ID != "anyone" {
			return errors.New("the world scheme's id is anyone")
		}
	case "auth":
		if auth == "" {
			return errors.New("the auth scheme needs credentials (Auth)")
		}
	case "digest":
		user, hash, _ := strings.Cut(a.ID, ":")
		if strings.Contains(a.ID, " ") {
			// url.ParseQuery turns a '+' of the base64 digest into a space.
			return errors.New("a space in a digest id (write a '+' of the digest as %2B in a URL)")
		}
		if b, err := base64.StdEncoding.DecodeString(hash); user == "" || err != nil || len(b) != sha1.Size {
			return errors.New("want user:<base64 of the SHA-1 of user:password> (28 characters), not a password " +
				"(zk.DigestACL computes it)")
		}
	case "ip":
		if _, _, err := net.ParseCIDR(a.ID); err != nil && net.ParseIP(a.ID) == nil {
			return errors.New("want an IP address or a CIDR block, such as 10.0.0.0/8")
		}
	case "x509":
		if a.ID == "" {
			return errors.New("no id (want the certificate's subject name)")
		}
	default:
		// Another authentication provider's (sasl, for Kerberos): the
		// server refuses a scheme it does not know (ErrInvalidACL, an
		// ErrInvalidConfig at open) and leaves the nodes untouched.
		if a.Scheme == "" || a.ID == "" {
			return fmt.Errorf("no scheme or no id (the schemes of ZooKeeper's own providers are %s)", strings.Join(schemes, ", "))
		}
	}
	return nil
}

// mayUse reports whether acl may give a client authenticated as auth
// (user:password, or "" for none) read, create and delete: entries for
// world:anyone, for auth (the creator's identities) and for auth's digest
// certainly apply to it; ip and x509 entries, and those of schemes of
// other providers (sasl), may, so an ACL that has one is given the benefit
// of the doubt (the server's answer at open decides).
func mayUse(acl []zk.ACL, auth string) bool {
	const need = zk.PermRead | zk.PermCreate | zk.PermDelete
	var mine string
	if user, pw, ok := strings.Cut(auth, ":"); ok {
		mine = zk.DigestACL(0, user, pw)[0].ID
	}
	var have int32
	for _, a := range acl {
		switch {
		case !slices.Contains(schemes, a.Scheme) || a.Scheme == "ip" || a.Scheme == "x509":
			return true
		case a.Scheme == "world" && a.ID == "anyone", a.Scheme == "auth" && auth != "",
			a.Scheme == "digest" && mine != "" && a.ID == mine:
			have |= a.Perms
		}
	}
	return have&need == need
}

// parseACL parses the URL parameter acl: entries scheme:id:perms separated
// by commas, as zkCli writes them (digest:alice:<base64 of SHA-1 of
// alice:password>:cdrwa, world:anyone:r, auth::cdrwa). The id is what lies
// between the first and the last colon, so a digest id keeps its own.
// Errors name an entry by its index, not its text.
func parseACL(v string) ([]zk.ACL, error) {
	var acl []zk.ACL
	for n, e := range strings.Split(v, ",") {
		i, j := strings.Index(e, ":"), strings.LastIndex(e, ":")
		if i < 0 || i == j {
			return nil, fmt.Errorf("%w: zookeeper: parameter acl: entry %d: want scheme:id:perms, such as digest:alice:<digest>:cdrwa or world:anyone:r", backend.ErrInvalidConfig, n+1)
		}
		a := zk.ACL{Scheme: e[:i], ID: e[i+1 : j]}
		for _, c := range e[j+1:] {
			k := strings.IndexRune(permLetters, c)
			if k < 0 || a.Perms&(1<<k) != 0 {
				return nil, fmt.Errorf("%w: zookeeper: parameter acl: entry %d: permissions: want letters among cdrwa, each once", backend.ErrInvalidConfig, n+1)
			}
			a.Perms |= 1 << k
		}
		acl = append(acl, a)
	}
	return acl, nil
}

// formatACL writes a as zkCli does (scheme:id:perms), but for a digest id's
// hash (an unsalted SHA-1 of user:password, which can be cracked): for
// logs.
func formatACL(a zk.ACL) string {
	var b strings.Builder
	id := a.ID
	if a.Scheme == "digest" {
		user, _, _ := strings.Cut(id, ":")
		id = user + ":<digest>"
	}
	b.WriteString(a.Scheme + ":" + id + ":")
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

// identity names the client a Locker with credentials auth is, for
// errors: the user name, never the password.
func identity(auth string) string {
	if auth == "" {
		return "an anonymous client (no Auth)"
	}
	user, _, _ := strings.Cut(auth, ":")
	return "user " + strconv.Quote(user)
}

// openErr is the error of Open for err, an error of ensurePrefix: the
// server's refusals (zk.ErrNoAuth: the prefix, or an ancestor, does not
// let this Locker create under it; zk.ErrInvalidACL: it refused the ACL)
// are configuration errors, anything else ErrUnavailable.
func (d *Driver) openErr(err error, auth string) error {
	switch {
	case errors.Is(err, zk.ErrNoAuth):
		return fmt.Errorf("%w: zookeeper: prefix %s: %s may not create nodes there (%w): "+
			"give it the create right on the prefix (setAcl), use the credentials (Auth) of the prefix's owner, "+
			"or use another prefix", backend.ErrInvalidConfig, d.prefix, identity(auth), err)
	case errors.Is(err, zk.ErrInvalidACL):
		return fmt.Errorf("%w: zookeeper: prefix %s: the server refuses the ACL (%w)", backend.ErrInvalidConfig, d.prefix, err)
	}
	return unavailable("creating the prefix", err)
}

// checkPrefixACL reads the prefix's ACL, once at open: a prefix this
// Locker may not read (zk.ErrNoAuth: it could not list or watch what it
// locks) is refused with ErrInvalidConfig. It logs a prefix that leaves
// the locks open: with credentials or an ACL, a prefix node whose ACL lets
// every client create, delete or change the ACL (it was made by someone
// else, or the ACL given says so), through which any client can delete an
// idle key directory, or the sentinel and then the prefix, or take the
// prefix over with SetACL, failing every acquire; without either, a server
// off the loopback network (every client that reaches it can delete any
// lock node). The common development case, no credentials on loopback,
// stays quiet.
func (d *Driver) checkPrefixACL(ctx context.Context, servers []string, o *Options) error {
	var acl []zk.ACL
	err := d.read(ctx, false, func() (err error) {
		acl, _, err = d.conn.GetACL(d.prefix)
		return err
	})
	switch {
	case errors.Is(err, zk.ErrNoAuth):
		return fmt.Errorf("%w: zookeeper: prefix %s: %s may not read it (%w): "+
			"give it the read right on the prefix (setAcl), use the credentials (Auth) of the prefix's owner, "+
			"or use another prefix", backend.ErrInvalidConfig, d.prefix, identity(o.Auth), err)
	case err != nil:
		return unavailable("reading the prefix's ACL", err)
	}
	if o.Auth == "" && len(o.ACL) == 0 {
		if s := remote(servers); s != "" {
			d.log.Warn("dlock/zookeeper: no credentials and no ACL: every client that reaches the ensemble can delete "+
				"lock nodes and take locks it does not hold; set Auth (user:password in the URL) or ACL", "server", s)
		}
		return nil
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
	return nil
}

// dialServer dials addr, an address of the server host, with dial and,
// with cfg, runs the TLS handshake over the connection (ServerName
// defaults to host), bounded by timeout.
func dialServer(dial zk.Dialer, cfg *tls.Config, host, network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := dial(network, addr, timeout)
	if err != nil || cfg == nil {
		return c, err
	}
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	t := tls.Client(c, cfg)
	_ = c.SetDeadline(time.Now().Add(timeout))
	if err := t.Handshake(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("zookeeper: TLS handshake with %s (%s): %w", host, addr, err)
	}
	_ = c.SetDeadline(time.Time{})
	return t, nil
}
