// Package matrix holds the fault matrix: one workload, recorded and checked
// by [github.com/dlock-go/dlock/conformance/check], run under the same
// faults against every backend on real servers (Redis, Redlock over five
// Redis masters, a three-member etcd cluster, a three-server ZooKeeper
// ensemble), with the faults injected through
// [github.com/dlock-go/dlock/tests/servers] (kill -9 and restart,
// SIGSTOP, a blackholing or slow TCP proxy, a server clock shifted with
// libfaketime) and a paused child process.
//
// Each cell (backend, fault) has an outcome expected from the backend's
// Guarantees: "safe" (no violation), "violation" (the unsafety the
// guarantees admit, demonstrated) or "unavailable" (the lock refused
// service cleanly and no property broke). TestMatrix fails when an
// observed outcome differs, and when the table in the README's "Backends
// and what they survive" section differs from the observed matrix.
// `make matrix` runs it and rewrites that table.
//
// The rows marked "election" run the workload on dlock.Election instead
// (election_test.go), under the faults where a leader differs from a
// mutex holder: a leader paused past its TTL, whose lead context must end
// when it resumes, and a kill -9 of the server the leader talks to, which
// its refreshed term must outlast. Each term is recorded as a lease
// (check.History.Granted, check.Lease.GivenUp) and checked the same way.
//
// The rows marked "semaphore" and "read-write lock" (shared_test.go) run
// shared leases (issue 24) on the backends that serve them (Redis, etcd,
// ZooKeeper; Redlock refuses them with dlock.ErrUnsupported and shows —):
// a permit holder or a writer paused past its TTL, and a kill -9 of the
// server while permits or readers are held. A semaphore's holders are
// concurrent, so the checker's permit count judges them (never more valid
// leases than permits); the read-write lock's writers update the fenced
// register and its readers read it with their tokens.
//
// Some expectations cannot come out unsafe on today's backends, by
// construction: a holder that goes on after its lease (paused, cut off,
// its lock dropped) is refused by the fenced register on every backend
// that issues tokens, and all four do; those rows show that the tokens do
// their job, and that no lease outlives what the servers grant. An
// injected expiry names the token of the lock it dropped where the
// servers can tell (the Redis counter, the etcd create revision, the
// ZooKeeper czxid); on Redlock it cannot, and the checker then treats
// every lease pending at the expiry as possibly dropped.
//
// TestExplore (explore_test.go) runs random operations and faults on the
// same framework instead of fixed scenarios, from a seed it prints: `make
// explore SEED=N BACKEND=B` replays a run, `make soak DURATION=1h` runs
// fresh seeds for a while, and `make test` runs one seed per backend.
//
// The package has only tests; it is not imported by the library.
package matrix
