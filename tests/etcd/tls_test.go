package etcd_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// TestTLSAndAuth opens etcds:// URLs against a member that serves clients
// over TLS, with authentication enabled: the CA given by the ca parameter
// and the user and password in the URL get a working Locker; a wrong
// password, or a server certificate the client does not trust, fail Open.
func TestTLSAndAuth(t *testing.T) {
	t.Parallel()
	c, err := servers.StartEtcdTLS(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Terminate(context.WithoutCancel(t.Context())) })
	ep := c.Endpoints()[0]
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, c.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}

	// A root user with the root role, then authentication on.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CAPEM)
	admin, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"https://" + ep},
		TLS:         &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(t.Context(), "root", "s3cret"); return err },
		func() error { _, err := admin.UserGrantRole(t.Context(), "root", "root"); return err },
		func() error { _, err := admin.AuthEnable(t.Context()); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("enabling authentication: %v", err)
		}
	}
	admin.Close()

	withCA := "&ca=" + url.QueryEscape(caFile)
	l, err := dlock.Open(t.Context(), "etcds://root:s3cret@"+ep+"/tls-auth?dial_timeout=5s"+withCA)
	if err != nil {
		t.Fatalf("Open over TLS with user and password: %v", err)
	}
	le, err := l.TryAcquire(t.Context(), "k", nil)
	if err != nil {
		t.Fatalf("TryAcquire over TLS with authentication: %v", err)
	}
	if le.Token() == 0 {
		t.Errorf("token 0 over TLS")
	}
	if err := le.Release(t.Context()); err != nil {
		t.Errorf("Release: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	_, err = dlock.Open(t.Context(), "etcds://root:wrong@"+ep+"/tls-auth?dial_timeout=5s"+withCA)
	if !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Errorf("Open with a wrong password = %v, want an error matching %v", err, rpctypes.ErrAuthFailed)
	}

	// Without ca the system pool is used, which does not trust the test CA.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l, err = dlock.Open(ctx, "etcds://root:s3cret@"+ep+"/tls-auth?dial_timeout=2s")
	if err == nil {
		l.Close()
		t.Fatal("Open of a server whose certificate is not trusted succeeded")
	}
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("Open of an untrusted server = %v, want ErrUnavailable", err)
	}
	t.Logf("untrusted server: %v", err)
}
