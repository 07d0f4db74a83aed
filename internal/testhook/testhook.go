// Package testhook hands a backend's internals to its tests that run
// against real servers. Those tests live in the development module
// (tests/...), outside the backend's package, so an export_test.go cannot
// reach them; instead the backend registers, in a file testhooks.go, the
// few functions its tests need (to inject a fault, to pause at a point of
// its algorithm, to read a pool's size), and the tests fetch them by name:
//
//	// etcd/testhooks.go
//	func init() { testhook.Set("etcd.PoolSize", func(d *Driver) int { return d.pool.size() }) }
//
//	// tests/etcd/hooks_test.go
//	var poolSize = testhook.Get[func(*etcd.Driver) int]("etcd.PoolSize")
//
// Being internal to github.com/dlock-go/dlock, the package is out of
// users' reach; a hook does nothing unless a test calls it.
package testhook

import (
	"fmt"
	"sync"
)

var (
	mu    sync.Mutex
	hooks = map[string]any{}
)

// Set registers v under name. A backend calls it from an init function; a
// second Set of one name panics (two hooks under one name are a mistake).
func Set(name string, v any) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := hooks[name]; dup {
		panic("testhook: " + name + " registered twice")
	}
	hooks[name] = v
}

// Get returns the value registered under name, as a T. It panics if none
// is registered or it is not a T: a test's mistake, found at once.
func Get[T any](name string) T {
	mu.Lock()
	v, ok := hooks[name]
	mu.Unlock()
	t, isT := v.(T)
	if !ok || !isT {
		var zero T
		panic(fmt.Sprintf("testhook: %s: registered %v (%T), want a %T", name, ok, v, zero))
	}
	return t
}
