package urlparam

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"strings"
)

// TLSConfig builds a client's TLS configuration from the URL parameters ca
// (a PEM file of the certificate authorities to trust; empty: the system
// pool), cert and key (PEM files of a client certificate and its key; both
// or neither) and serverName (the name to verify; empty: the host dialled).
// backendName ("redis", "etcd") starts its error messages. It reads the
// files, and does no other I/O; its errors wrap backend.ErrInvalidConfig.
// The result verifies the server's certificate and asks for TLS 1.2 or
// later.
func TLSConfig(backendName, ca, cert, key, serverName string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, bad("%s: parameter ca: %w", backendName, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, bad("%s: parameter ca: no PEM certificate in %s", backendName, ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, bad("%s: parameters cert and key go together", backendName)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, bad("%s: client certificate: %w", backendName, err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// The warnings a backend logs when it opens a connection that anyone on the
// network path can read or impersonate (after "dlock/<backend>: ").
const (
	// SkipVerifyWarning: TLS with skip_verify=true.
	SkipVerifyWarning = "skip_verify=true: the server's certificate is not checked; " +
		"anyone on the path can read the password and the locks (trust a private CA with ca= instead)"
	// PlaintextPasswordWarning: a password over a connection without
	// TLS to a server that is not on loopback.
	PlaintextPasswordWarning = "the password is sent in clear text (no TLS) to a server that is not on loopback; " +
		"anyone on the path can read it and the locks (use TLS)"
)

// Loopback reports whether addr (host:port, or a host) names this machine:
// localhost or a loopback IP address. Names other than localhost are not
// looked up (no I/O): they count as remote.
func Loopback(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
