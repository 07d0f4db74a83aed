// Package failover measures leader failover time: how long after the
// leader's process is killed with SIGKILL a waiting candidate runs as the
// new leader. It compares dlock's Election on every backend with etcd's
// concurrency.Election and client-go's leaderelection, on the same servers
// and with the same lease time (failoverLease, 3 s). It lives in the
// development module (tests), so that client-go and the peers stay out of
// the library's dependencies.
//
// From the repository root:
//
//	make failover              # 20 runs per configuration, then a Markdown table
//	make failover RUNS=50      # another number of runs
//
// `make test` runs TestFailover too, with 2 runs per configuration and the
// configurations in parallel: a smoke test that checks what every run
// checks (below), never a time.
//
// # Method
//
// Each candidate is a process of its own: the test binary run again with
// DLOCK_FAILOVER_CANDIDATE set (see TestMain), which makes it a candidate
// and nothing else. A candidate writes one line on stdout when it is about
// to campaign ("campaigning") and one the moment it becomes leader
// ("leading TERM": dlock's lead function, etcd's Campaign returning,
// client-go's OnStartedLeading), and the parent timestamps the lines as
// they arrive. One run, on a key no other run uses:
//
//  1. start candidate A and wait until it leads;
//  2. start candidate B and wait until it campaigns, then a settling pause
//     of 1 s plus a random part of up to a third of the lease time, so that
//     the kill lands at a random point of the leader's renewal cycle;
//  3. check that B has not reported leading (two leaders), SIGKILL A's
//     process (its connections die as a crashed process's do; nothing is
//     released), and measure from the kill to B's "leading" line;
//  4. check that B's term is higher than A's (dlock: the fencing token;
//     etcd: the create revision of the leader's key; client-go: the
//     record's leaderTransitions), and kill B.
//
// The configurations, all with a lease time of 3 s:
//
//   - dlock Election on Redis (one server), Redlock (five masters), etcd
//     (one member): ElectionOptions.TTL 3 s, the Locker opened from a URL
//     with ttl=3s and otherwise default options.
//   - dlock Election on ZooKeeper (one standalone server): a leader's death
//     is noticed when its session expires, so the session timeout is the
//     lease time: zk://...?session_timeout=3s&tick_time=200ms&ttl=1800ms.
//     The test servers tick every 200 ms (tick_time tells the driver so),
//     and 1.8 s is the longest TTL that session allows (3 s - 3 s/3 -
//     200 ms; see package zookeeper); the TTL only paces the leader's
//     refreshes, the session's expiry decides the failover.
//   - etcd's concurrency.Election (go.etcd.io/etcd/client/v3/concurrency)
//     on the same etcd server: a Session with TTL 3 (seconds), Campaign.
//   - client-go's leaderelection (k8s.io/client-go/tools/leaderelection) on
//     the same etcd server. There is no Kubernetes API server here, so its
//     resourcelock.Interface is implemented over etcd (etcdLock): the
//     LeaderElectionRecord is stored as JSON under one key, Create is a
//     put-if-absent and Update a compare-and-swap on the key's mod revision
//     (what the API server's resourceVersion check does). LeaseDuration
//     3 s, RenewDeadline 2 s, RetryPeriod 400 ms: client-go's usual
//     15 s / 10 s / 2 s scaled by 1/5. It measures client-go's algorithm
//     (followers poll every RetryPeriod, with jitter, and take over once
//     they have seen no change of the record for LeaseDuration) on etcd,
//     not on an API server.
//
// The table gives, per configuration, the number of runs, the median
// (p50) and the 99th percentile (p99) by nearest rank, and the fastest
// run. With 20 runs the nearest-rank p99 is the slowest run, the maximum.
//
// Knobs (environment): DLOCK_FAILOVER_RUNS (runs per configuration; when
// set, the configurations run one after another, interleaved run by run,
// so that a burst of load from elsewhere is spread over all of them),
// DLOCK_FAILOVER_ONLY (a regular expression: only the configurations whose
// name matches), DLOCK_FAILOVER_TABLE (a file the Markdown table is
// written to, besides the test's output). The servers are started through
// tests/servers, as `make test` sets them up (scripts/test.sh
// --setup-only).
package failover
