// Package bench compares dlock with other lock libraries in the same run,
// on the same servers, and runs the scale workloads. It is a package of the
// development module tests, so that users of dlock never inherit the
// peers' dependencies.
//
// From the repository root:
//
//	make peers          # tests/bench/run.sh: -count 6, benchstat tables
//	make peers-smoke    # every benchmark once, the scale workloads shrunk
//
// run.sh sets the servers up as `make test` does (scripts/test.sh
// --setup-only); the test binary starts them through tests/servers
// (Redis ×5, a single-member and a 3-member etcd cluster, a standalone
// ZooKeeper server and a 3-server ensemble) and every library of a backend
// runs against the same ones:
//
//   - BenchmarkCycle/backend=B/w=W/lib=L: uncontended acquire + release,
//     W = 1 and 16 workers sharing one client, each worker on its own key
//     (cycles/s, cli-µs/op).
//   - BenchmarkHandoff/backend=B/lib=L: 8 workers, each with its own
//     client, on one key with hold 0 (cycles/s, wait p50-ms and p99-ms,
//     spread = most / fewest acquisitions of a worker).
//   - BenchmarkSemaphore/backend=B/hold=H/lib=L: 16 workers, each with its
//     own client, loop acquire one permit of a semaphore of 4 / hold H (0
//     and 1ms) / release, on one key (permits/s, cli-µs/op, peak-held;
//     more than 4 held at once fails the benchmark), on the backends that
//     serve shared leases.
//   - BenchmarkScaleLeases/backend=B: 10,000 auto-refreshed leases at TTL
//     3 s on one Locker, held 15 s (lost, goroutines, client CPU and RSS,
//     server ops and writes per second).
//   - BenchmarkScaleWaiters/backend=B/lockers=L: 1,000 waiters on one key
//     through 1 or 10 Lockers (server ops per acquisition, connections,
//     goroutines).
//
// The libraries: backend=redis: raw go-redis (SET NX PX + EVALSHA
// compare-and-delete), bsm/redislock, redsync with one pool, dlock;
// backend=redlock: redsync with five pools, dlock; backend=etcd:
// concurrency.Mutex with a reused Session and with a Session per lock,
// dlock; backend=zookeeper: go-zookeeper's zk.Lock, dlock; backend=etcd3
// and backend=zookeeper3: the same on the 3-member cluster and ensemble
// (BenchmarkCycle and BenchmarkHandoff). The semaphore's
// peers (semaphore_test.go): backend=redis: Redisson's
// RPermitExpirableSemaphore and RSemaphore written again on go-redis;
// backend=zookeeper: Curator's InterProcessSemaphoreV2 written again on
// go-zookeeper; backend=etcd: a naive recipe on etcd's concurrency package
// (etcd has no semaphore). By hand:
//
//	eval "$(scripts/test.sh --setup-only)"
//	cd tests/bench && GOWORK=off go test -run '^$' -bench '^Benchmark(Cycle|Handoff)$' -count 6 . | tee /tmp/peers.txt
//	benchstat -filter '.name:(Cycle OR Handoff) /backend:redis' -col '/lib@(raw redislock redsync dlock)' /tmp/peers.txt
//
// The scale workloads run once per iteration: use a duration -benchtime
// (such as the default 1s), not an iteration count above 1.
//
// DLOCK_BENCH_RATE=N paces BenchmarkCycle (and BenchmarkSemaphore) to at
// most N cycles per second in all, so that two libraries' CPU per cycle is
// compared at the same rate, below both their ceilings (on ZooKeeper the
// server's CPU per cycle depends on the rate: docs/performance.md).
package bench
