package etcd_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

func TestMain(m *testing.M) { servers.Main(m) }

// newClient returns a client of the cluster, closed when tb ends.
func newClient(tb testing.TB, endpoints []string) *clientv3.Client {
	tb.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// newLocker returns a Locker with its own client (closed with the Locker),
// as a separate process would have, closed when tb ends.
func newLocker(tb testing.TB, endpoints []string, opts *dlock.Options) *dlock.Locker {
	tb.Helper()
	l, err := openLocker(tb.Context(), endpoints, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return l
}

func openLocker(ctx context.Context, endpoints []string, opts *dlock.Options) (*dlock.Locker, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	d, err := etcd.NewDriver(ctx, c, &etcd.Options{Locker: opts}) // the Logger
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	ownClient(d)
	l, err := driver.New(d, opts)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return l, nil
}

// mustNew is driver.New for Options that are valid.
func mustNew(tb testing.TB, d *etcd.Driver, opts *dlock.Options) *dlock.Locker {
	tb.Helper()
	l, err := driver.New(d, opts)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// dir is the queue directory of key with the default prefix.
func dir(key string) string {
	return etcd.DefaultPrefix + strings.NewReplacer("%", "%25", "/", "%2F").Replace(key) + "/"
}

func uniqueKey(tb testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(tb.Name(), "/", ".") + "." + hex.EncodeToString(b[:])
}
