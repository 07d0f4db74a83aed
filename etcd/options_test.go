package etcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/etcd"
)

// TestNegativeRequestTimeout: a bad option is an error before any I/O (the
// client's endpoint answers nothing).
func TestNegativeRequestTimeout(t *testing.T) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := etcd.NewDriver(ctx, c, &etcd.Options{RequestTimeout: -time.Second}); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("NewDriver with RequestTimeout -1s = %v, want ErrInvalidConfig", err)
	}
}

// New refuses bad opts.Locker before any I/O, a TTL below etcd's floor of
// 1s included (it used to be found by the first acquire, after New had
// asked the cluster for its members).
func TestNewRejectsBadLockerOptionsBeforeIO(t *testing.T) {
	// No server at this address: an I/O would fail with ErrUnavailable.
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, lo := range map[string]dlock.Options{
		"negative retry":      {RetryMin: -time.Millisecond},
		"TTL below floor":     {TTL: 500 * time.Millisecond},
		"drift factor":        {DriftFactor: 0.7},
		"retry max below min": {RetryMin: time.Second, RetryMax: time.Millisecond},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		l, err := etcd.New(ctx, c, &etcd.Options{Locker: &lo})
		cancel()
		if l != nil {
			_ = l.Close()
		}
		if errors.Is(err, dlock.ErrUnavailable) || (!errors.Is(err, dlock.ErrInvalidConfig) && !errors.Is(err, dlock.ErrInvalidTTL)) {
			t.Errorf("%s: New = %v; want ErrInvalidConfig or ErrInvalidTTL, before any I/O", name, err)
		}
	}
}

// A prefix that does not end with "/" is refused before any I/O: "app"
// would share its keys' directories with "app2", and a role granted "app"
// would cover "app2". (Before: accepted.)
func TestPrefixNeedsSlash(t *testing.T) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}}) // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err = etcd.NewDriver(ctx, c, &etcd.Options{Prefix: "app"})
	if !errors.Is(err, backend.ErrInvalidConfig) || !strings.Contains(err.Error(), `"app/"`) {
		t.Fatalf("Prefix \"app\": %v; want ErrInvalidConfig suggesting \"app/\"", err)
	}
}
