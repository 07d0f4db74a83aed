package etcd_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/fence"
)

// TestFenceStoreChecksInput: etcd.FenceStore refuses token 0, an empty key
// and a missing client as fence's own stores do, with ErrInvalidConfig
// and before any I/O. The client points at a port nothing serves: a Set
// that reached etcd would fail with ErrUnavailable instead.
func TestFenceStoreChecksInput(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	var _ fence.Store = etcd.FenceStore{}
	for _, c := range []struct {
		what  string
		store etcd.FenceStore
		key   string
		token dlock.Token
	}{
		{"token 0", etcd.FenceStore{Client: ec}, "k", 0},
		{"empty key", etcd.FenceStore{Client: ec}, "", 7},
		{"no client", etcd.FenceStore{}, "k", 7},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := c.store.Set(ctx, c.key, "v", c.token)
		cancel()
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%s: %v; want ErrInvalidConfig", c.what, err)
		}
	}
}
