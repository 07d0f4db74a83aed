package etcd_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/etcd"
)

// authCluster starts a 1-member cluster of the test's own with
// authentication on: user root (password rootpw, role root) and user
// locker (password lockerpw) whose role "locker" may read and write the
// keys under "app/" only. It returns the endpoints and a client of root.
func authCluster(t *testing.T) ([]string, *clientv3.Client) {
	t.Helper()
	eps := ownCluster(t, 1).Endpoints()
	ctx := t.Context()
	c := newClient(t, eps)
	steps := []func() error{
		func() error { _, err := c.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.RoleAdd(ctx, "locker"); return err },
		func() error {
			_, err := c.RoleGrantPermission(ctx, "locker", "app/", clientv3.GetPrefixRangeEnd("app/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := c.UserAdd(ctx, "locker", "lockerpw"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "locker", "locker"); return err },
		func() error { _, err := c.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("setting up authentication, step %d: %v", i, err)
		}
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Username: "root", Password: "rootpw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close() })
	return eps, root
}

// lockerDriver opens a Driver as user locker with prefix, logging to rec.
func lockerDriver(ctx context.Context, t *testing.T, eps []string, prefix string, rec *conformance.LogRecorder) (*etcd.Driver, error) {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Username: "locker", Password: "lockerpw"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := etcd.NewDriver(ctx, c, &etcd.Options{Prefix: prefix, Locker: &dlock.Options{Logger: slog.New(rec)}})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	ownClient(d)
	t.Cleanup(func() { _ = d.Close() })
	return d, nil
}

// A user without the right to read and write the prefix is refused when
// the Locker is opened, with ErrInvalidConfig naming the user, the prefix
// and the grant to make; with the right, locks work, wake-ups included.
// (Before: the open succeeded after the request timeout, and the prefix
// watch failed and retried every ~50ms, logging each time.) When the right
// is taken away later, the watch backs off and logs little, and comes back
// when the right does.
func TestAuthPermissions(t *testing.T) {
	eps, root := authCluster(t)

	t.Run("refused at open", func(t *testing.T) {
		for _, prefix := range []string{"dlock/", "ap/", "app2/"} {
			_, err := lockerDriver(t.Context(), t, eps, prefix, &conformance.LogRecorder{})
			if !errors.Is(err, backend.ErrInvalidConfig) {
				t.Fatalf("prefix %q without the right: %v; want ErrInvalidConfig", prefix, err)
			}
			for _, want := range []string{`"locker"`, `"` + prefix + `"`, "permission denied", "grant-permission"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("prefix %q: error %q does not say %s", prefix, err, want)
				}
			}
		}
	})

	t.Run("granted", func(t *testing.T) {
		d, err := lockerDriver(t.Context(), t, eps, "app/", &conformance.LogRecorder{})
		if err != nil {
			t.Fatalf("prefix app/ with the right: %v", err)
		}
		l := mustNew(t, d, &dlock.Options{TTL: 5 * time.Second})
		key := uniqueKey(t)
		le, err := l.Acquire(t.Context(), key, nil)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		got := make(chan error, 1)
		go func() {
			le2, err := l.Acquire(context.Background(), key, nil)
			if err == nil {
				err = le2.Release(context.Background())
			}
			got <- err
		}()
		time.Sleep(200 * time.Millisecond) // let it queue; not needed for correctness
		if err := le.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("the waiter: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the waiter was not woken within 30s of the release")
		}
	})

	t.Run("lost later", func(t *testing.T) {
		rec := &conformance.LogRecorder{}
		d, err := lockerDriver(t.Context(), t, eps, "app/", rec)
		if err != nil {
			t.Fatalf("prefix app/ with the right: %v", err)
		}
		created := watchCreated(d)
		// A held lock, so that the driver watches its directory.
		l := mustNew(t, d, &dlock.Options{TTL: time.Minute})
		if _, err := l.Acquire(t.Context(), uniqueKey(t), nil); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		select {
		case <-created:
		case <-time.After(30 * time.Second):
			t.Fatal("the lock's directory watch was not made within 30s")
		}
		var attempts atomic.Int32
		beforeWatch(d, func() { attempts.Add(1) })
		if _, err := root.RoleRevokePermission(t.Context(), "locker", "app/", clientv3.GetPrefixRangeEnd("app/")); err != nil {
			t.Fatal(err)
		}
		breakWatch(d)
		const window = 4 * time.Second
		time.Sleep(window)
		warned := len(rec.Above(slog.LevelInfo))
		tried := attempts.Load()
		t.Logf("%d warnings and %d watches in %v without the right", warned, tried, window)
		// Back-off: 50ms three times, then doubling up to 2s: at most 9
		// watches in 4s (a retry every 50ms would make about 80).
		if tried > 12 {
			t.Errorf("%d watches made in %v while the right was missing; want the back-off's at most 12", tried, window)
		}
		// A retry every 50ms would log about 80 times; with the back-off
		// doubling from 50ms there are at most 7 attempts in 4s, and the
		// warnings after the first are spaced further apart still.
		if warned > 3 {
			t.Errorf("%d warnings in %v while the right was missing: %q; want at most 3", warned, window, rec.Above(slog.LevelInfo))
		}
		if warned == 0 {
			t.Errorf("no warning while the watch on the prefix could not be made")
		}
		for len(created) > 0 {
			<-created
		}
		if _, err := root.RoleGrantPermission(t.Context(), "locker", "app/", clientv3.GetPrefixRangeEnd("app/"), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-created:
		case <-time.After(30 * time.Second):
			t.Fatal("the watch did not come back within 30s of the right being granted again")
		}
	})
}
