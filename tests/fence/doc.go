// Package fence holds the tests of github.com/dlock-go/dlock/fence that
// run against real servers (Redis, etcd, PostgreSQL, and every lock
// backend): they live in the tests module, so the fence module's go.mod
// holds only what fence itself needs.
//
// The package has only tests.
package fence
