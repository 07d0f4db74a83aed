package urlparam_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/urlparam"
	"github.com/dlock-go/dlock/internal/urlparam/urltest"
)

// writeSelfSigned writes a self-signed certificate and its key as PEM files
// in dir and returns their paths.
func writeSelfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	cert, key := urltest.SelfSigned(t, "test")
	return urltest.WriteFile(t, dir, "cert.pem", cert), urltest.WriteFile(t, dir, "key.pem", key)
}

func TestTLSConfig(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeSelfSigned(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}

	tc, err := urlparam.TLSConfig("redis", cert, cert, key, "db.example")
	if err != nil {
		t.Fatal(err)
	}
	if tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.ServerName != "db.example" || tc.InsecureSkipVerify {
		t.Errorf("TLSConfig = %+v; want the CA pool, one client certificate, the server name, verification on", tc)
	}
	if tc, err := urlparam.TLSConfig("redis", "", "", "", ""); err != nil || tc.RootCAs != nil || tc.InsecureSkipVerify {
		t.Errorf("TLSConfig with no files = %+v, %v; want the system pool, verification on", tc, err)
	}

	for _, c := range []struct{ name, ca, cert, key, want string }{
		{"missing ca", filepath.Join(dir, "absent.pem"), "", "", "parameter ca"},
		{"ca without PEM", notPEM, "", "", "no PEM certificate"},
		{"cert without key", "", cert, "", "cert and key go together"},
		{"key without cert", "", "", key, "cert and key go together"},
		{"key not matching", "", cert, notPEM, "client certificate"},
	} {
		_, err := urlparam.TLSConfig("redis", c.ca, c.cert, c.key, "")
		if !errors.Is(err, backend.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(strings.TrimPrefix(err.Error(), backend.ErrInvalidConfig.Error()+": "), "redis: ") {
			t.Errorf("%s: err = %v; want ErrInvalidConfig naming redis and %q", c.name, err, c.want)
		}
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:6379": true, "127.1.2.3:1": true, "[::1]:6379": true, "localhost:6379": true, "LOCALHOST": true, "::1": true,
		"10.0.0.1:6379": false, "redis.example:6379": false, "[2001:db8::1]:6379": false, "localhost.example:1": false, "": false,
	} {
		if got := urlparam.Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v; want %v", addr, got, want)
		}
	}
}
