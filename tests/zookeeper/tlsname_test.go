package zookeeper_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// tlsProxy serves TLS on a loopback port with a certificate for the name
// localhost only (no IP address in it), issued by a CA of its own, and
// relays every connection to the plain server target. It returns the
// port and the path of the CA's PEM certificate; it stops when tb ends.
func tlsProxy(tb testing.TB, target string) (port, caFile string) {
	tb.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			tb.Fatal(err)
		}
		return k
	}
	caKey, leafKey := key(), key()
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dlock test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	caFile = filepath.Join(tb.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		tb.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		tb.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			track(c)
			track(up)
			wg.Add(2)
			relay := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
			}
			go relay(up, c)
			go relay(c, up)
		}
	}()
	tb.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, caFile
}

// TestTLSServerNameIsTheHostDialled: the name TLS verifies by default is
// the server's host as given (localhost), not the address it resolves to:
// a certificate that names the host only is accepted (issue 21 review,
// finding 2). A CA that did not issue it fails Open with the x509 error,
// not only "no answer within dial_timeout" (finding 3).
func TestTLSServerNameIsTheHostDialled(t *testing.T) {
	port, ca := tlsProxy(t, servers.ZooKeeper(t, 1).Servers()[0])
	q := url.Values{"ca": {ca}, "session_timeout": {testSession.String()}, "tick_time": {testTick.String()},
		"dial_timeout": {"20s"}}
	l, err := dlock.Open(t.Context(), "zks://localhost:"+port+"/tlsname?"+q.Encode())
	if err != nil {
		t.Fatalf("zks://localhost with a certificate for localhost only: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	lease, err := l.TryAcquire(t.Context(), uniqueKey(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	q.Del("ca") // the system's CAs, which did not issue the certificate
	q.Set("dial_timeout", "3s")
	if l, err := dlock.Open(t.Context(), "zks://localhost:"+port+"/tlsname?"+q.Encode()); err == nil {
		_ = l.Close()
		t.Fatal("zks:// with a CA that did not issue the certificate: opened, want ErrUnavailable")
	} else if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("zks:// with a CA that did not issue the certificate: %v, want ErrUnavailable saying %q", err,
			"certificate signed by unknown authority")
	}
}

// TestTLSOptionsServerName: Options.TLS without a ServerName verifies each
// server's host as given.
func TestTLSOptionsServerName(t *testing.T) {
	port, ca := tlsProxy(t, servers.ZooKeeper(t, 1).Servers()[0])
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	l := openWithin(t, []string{"localhost:" + port},
		&zookeeper.Options{Prefix: "/tlsname", TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	lease, err := l.TryAcquire(t.Context(), uniqueKey(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
