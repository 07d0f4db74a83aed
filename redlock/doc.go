// Package redlock is the dlock backend for Redlock: one lock over N
// independent Redis masters (an odd number, at least 3; 5 is typical),
// implemented as the Redis "Distributed locks" page specifies. It is an
// efficiency lock: where two holders would corrupt data, use etcd or
// ZooKeeper (Kleppmann, "How to do distributed locking").
//
//	locker, err := redlock.New(ctx, []goredis.UniversalClient{c1, c2, c3, c4, c5}, nil)
//
// or dlock.Open(ctx, "redlock://h1:6379,h2:6379,h3:6379,h4:6379,h5:6379?ttl=10s")
// after importing this package.
//
// # The algorithm
//
//   - Acquire takes the start time on the monotonic clock and sends the
//     single-Redis acquire script (SET key value NX PX ttl, and a token from
//     the node's counter) to all N nodes in parallel, each round trip cut at
//     NodeTimeout (default 50ms, at most a tenth of the TTL), so an attempt
//     costs the slowest round trip it needs, not their sum. The value is
//     the same on every node, laid out as by the redis backend: the holder
//     description (dlock.AcquireOptions.Holder; nothing when it is empty)
//     followed by 32 hex digits from crypto/rand, unique per grant. So the
//     holder is stored with the lock on each node, atomically with the
//     node's grant, and [Driver.Inspect] returns it in LockInfo.Holder:
//     the holder of the value a majority of the nodes holds.
//   - It returns as soon as the outcome is decided, not when every node has
//     answered: a grant once a majority (N/2+1) has granted with validity
//     left (TTL − elapsed − drift > 0, drift = TTL × DriftFactor + 2ms); a
//     refusal once so many nodes have refused or failed that no majority is
//     possible. The replies still on their way are handled when they come
//     (see "Returning early" below).
//   - A failed attempt deletes the key where it may have been set: on the
//     nodes that granted, whose reply was lost, or whose reply is still to
//     come (queued behind the acquire there). A node that refused holds
//     nothing of ours and gets nothing. The refusal waits for these
//     deletes at most twice the time it took to decide (and at most the
//     release timeout), so that a node merely slower than the others is
//     cleaned before it returns, but a node that does not answer is not
//     waited for; the rest ends in the background (Close waits for it).
//     Under contention this matters: a split vote's keys left behind while
//     the contenders wait again block their next round, and the deletes
//     wake them all at once again.
//   - The dlock layer retries after a jittered delay (so competing clients
//     do not split the vote forever), bounded by the caller's context. A
//     lock held by others is reported as ErrNotAcquired; when too few nodes
//     answer to tell, the attempt fails with ErrUnavailable, which ends
//     TryAcquire, while Acquire tries again and gives up only after
//     three such rounds in a row. A node cut at the
//     per-node timeout (or any timeout of the Driver's own) fails with an
//     error that does not match context.DeadlineExceeded: that deadline is
//     not the caller's. When the caller's context ends during an attempt,
//     the error matches ErrNotAcquired and ctx.Err().
//   - Release is a compare-and-delete on the nodes where the lease may hold
//     the key (not on those that refused it); it returns once a majority
//     has confirmed (or said it was not ours), the other deletes finishing
//     in the background (Close waits for them).
//   - Refresh is a compare-and-PEXPIRE on the nodes where the lease may
//     hold the key: it never re-creates a lapsed key (that would be a new
//     acquire) and counts only with a majority, answered within the TTL
//     less the drift; it returns once that is decided. The same script
//     raises each node's counter to the token (see Fencing below). The
//     dlock watchdog bounds each refresh by the lease's deadline and the
//     total hold by MaxHold. The Driver is a backend.BatchRefresher: the
//     watchdog's refreshes that come due together go to each node in one
//     pipeline, the nodes in parallel, each lease decided by majority as
//     Refresh decides it.
//   - Lease.Deadline is the start of the attempt plus the TTL, less the
//     drift margin: the validity the algorithm computes (the Locker uses
//     this backend's DriftFactor when it is larger than its own).
//   - Release raises each node's counter to the token in the script that
//     deletes the lock, so no later grant there can be issued before the
//     node knows it (see Fencing below).
//   - Release succeeds only if the lock was still ours on a majority;
//     otherwise the lease had been lost (ErrNotHeld), whatever a minority
//     still held (it is deleted too).
//   - Every script goes through one queue per node: a long-lived worker per
//     node sends what is queued as one pipeline, so concurrent attempts,
//     releases and refreshes share round trips, and no goroutine is started
//     per node per call. The calls to a node run in the order they were
//     queued (a pipeline is sent once the one before has been answered):
//     a release queued while its acquire is on its way runs after it (also
//     when the node has lost its scripts: a call followed in its pipeline
//     by another call of the same grant is sent with EVAL, so a NOSCRIPT
//     answer, sent again after the pipeline, never moves it past one). Over
//     a node slower than the per-node timeout, the calls queued behind a
//     slow pipeline wait for it, and those whose timeout passes meanwhile
//     fail without being sent.
//   - One server given twice would vote twice: New refuses (with
//     ErrInvalidConfig naming both nodes) a client given twice, and two
//     clients that reach one server: the same host and port however
//     spelt (127.0.0.1:6379, 127.0.0.1:06379, localhost:6379, an
//     IPv4-mapped [::ffff:127.0.0.1]:6379), whatever their database
//     numbers. IP literals and localhost are compared before any I/O;
//     other host names are resolved in New (a DNS lookup, at most 2s; a
//     name that does not resolve then is compared as written, and later
//     DNS changes are not seen; if ctx ends during the lookups, New fails
//     with an error wrapping ErrUnavailable and ctx.Err()). One server
//     reached through two different IP addresses of its own (say
//     127.0.0.1 and 127.0.0.2, or a LAN address) is not detected. Only
//     clients that dial their Addr are compared: a Sentinel failover
//     client (its Addr is "FailoverClient") or a client with a custom
//     Dialer (which may connect anywhere) is not checked against the
//     others; a Dialer made by goredis.NewDialer cannot be told from the
//     default one, and is compared by the client's Addr even if it was
//     made from options with another address. A Unix socket path is compared after filepath.Clean only
//     (a symlink, a relative path from another directory, or a hard link
//     to the same socket is not recognised).
//
// # Returning early: the token and the deadline of a grant
//
// A grant is returned when a majority has granted, before the other nodes
// have answered. Its token is the largest of that majority's (the nodes that
// had answered then): any later majority shares a node with it, which is
// what the token's order rests on (see Fencing). A node that grants later
// (a straggler) is part of the lease all the same: Refresh extends and
// Release deletes the key there; its token, which may be larger or smaller
// than the lease's, is not the lease's, but if it is below the token and
// its clock would not pass the token before the key can expire there, the
// token is written back to it as for the majority's nodes. If the lease has
// been released (or the attempt failed) by the time a straggler grants,
// the key is deleted there at once.
//
// The validity does not change: Lease.Deadline counts from the start of the
// attempt, before any node could have set the key, so a straggler's key
// (set later, expiring later) does not shorten it; a straggler cannot make
// the lease valid for longer either. Returning early only removes the wait
// for the slowest nodes: with a minority of nodes slow or down, a grant no
// longer costs the per-node timeout, and the validity left is larger by
// that much.
//
// # Waiting: woken by releases
//
// Acquire does not poll a held lock: the Driver implements backend.Waiter
// (Guarantees().WakesWaiters is true). Once an attempt has found the lock
// held, the waiter subscribes to the key's release channel on every node
// (one pub/sub connection per node, shared by all the Driver's waiters; the
// redis backend's code, internal/redisx/redishub) and is woken when any node
// publishes a release. The release script publishes on each node where a
// waiter's attempt marked the lock, and the holder's majority shares a node
// with the subscribed majority, so one release wakes every waiter. The
// subscription counts once a majority of the nodes has confirmed it (within
// 4 × NodeTimeout, at least 500ms; otherwise Acquire logs a warning and
// polls). A wake-up lost to a failing node is made up by the Locker's
// fallback poll every RetryMax. Woken waiters each run a full round; one
// wins, the others wait again (no FIFO order).
//
// # Fencing: best effort
//
// Redlock has no consensus-grade token; Guarantees reports
// FencingBestEffort. Every node runs the single-Redis acquire script (see
// the redis package), and a later majority shares at least one node with an
// earlier one.
// Each node issues the larger of its counter + 1 and its clock in
// microseconds, and the token is the largest of the majority's. Release and
// Refresh raise every node's counter to the token in the script that deletes
// or extends the lock; a granting node whose clock at the grant, plus the
// TTL less the drift, does not pass the token has it written back right
// after the grant. A later holder's token can equal or go below an earlier
// one only if no node of the later majority had recorded the earlier token
// (the nodes the two majorities share lost their counter or restored a stale
// one in a restart, or the lock key was deleted early on such a node
// (evicted, DEL, FLUSH), or the lease's key expired on that node (unreleased
// there) and a write-back that was due failed or landed after it had
// expired) and the clocks of the later majority all read behind it: stepped
// back by more than the time since the earlier grant (an outage included),
// or behind the clock that issued it by more than the time between the two
// grants.
//
// The clock assumption behind the write-back that is skipped: a node whose
// clock at the grant (read in the acquire script), plus the TTL less the
// drift, is past the token lets the lock key expire only once its clock
// reads past the token, and every later grant there issues at least its
// clock. That holds unless the node's clock steps back, the node stalls
// for longer than the drift between the start of the acquire script and its
// clock reading, or the lock key goes before its expiry: deleted (DEL,
// FLUSH) or evicted (New does not check the nodes' maxmemory-policy, as the
// redis backend does: run them with noeviction). A Refresh, which can move
// the expiry earlier, raises the counters in its script. With clocks in step, no write-back runs: a lease costs
// one script per node to acquire and one to release. The write-back that
// does run (raise.lua) is in the background, so it does not delay the
// caller; Release does not wait for it (its own script raises the
// counters).
//
// Counters and tokens are compared and returned as decimal strings, not
// Lua numbers (doubles), so tokens stay exact beyond 2^53.
//
// # Fencing counters stay: one key per lock name per node
//
// The fencing counters never expire. Every node that has granted a lock
// name, or been given a token for it (a write-back, or the Release and
// Refresh scripts raising it), keeps that name's counter,
// Prefix+"{"+name+"}:fence" (the lock key plus ":fence"), a string of
// about 16 decimal digits (the token: microseconds since the Unix epoch, or
// above), after the lock is released, until someone deletes it. So there is
// one such key per distinct lock name ever used, on each node: for a fixed
// set of names that is a small, bounded cost, but a program that locks
// ever-new names (request IDs, say) adds a key to every node for each name,
// for good. (The redis backend's counters expire after
// Options.FenceRetention when they are behind the clock; Redlock has no
// such option.)
//
// They must not expire because the tokens must not go backwards, and the
// counter is what holds them: a node whose clock is behind a lease's
// token (its token came from a node with a clock ahead) has the token
// written back to its counter, and until that node's clock passes it, the
// counter alone keeps the node from issuing a lower token to the next
// holder. A counter that expired (or is deleted) while ahead of its node's
// clock lets a later holder's token equal or go below an earlier one, as
// a counter lost in a restart does (see Fencing above).
//
// To clean them, delete a counter only when it no longer orders anything:
// its lock name is not in use (no lock key Prefix+"{"+name+"}" on the
// node), and its value is below the node's own clock (TIME, as seconds ×
// 10^6 + microseconds) by more than the largest step back you allow that
// clock; the node's next grant then issues at least its clock, which is
// past the deleted value. Do it per node (SCAN MATCH Prefix+"{*}:fence"),
// with GET, TIME, EXISTS and DEL in one script so that no grant slips in
// between. A counter deleted while ahead of its node's clock is the
// documented best-effort case above.
//
// # Shared leases: not served
//
// Redlock serves no shared leases (semaphore permits,
// dlock.AcquireOptions.Permits, or readers' leases, AcquireOptions.Shared):
// Guarantees().Shared is false, and the dlock layer refuses such an
// acquire with dlock.ErrUnsupported before any I/O. Majorities keep a
// mutex (two majorities share a node, which refuses the second holder),
// but not a count: with 3 nodes and 2 permits, holders granted by nodes
// {1,2}, {1,3} and {2,3} each have a majority while no node counts more
// than 2 of them, so 3 permits of 2 would be held. Use the redis backend
// (one server, or Sentinel or Cluster), etcd or ZooKeeper for shared
// leases. (The nodes run the redis backend's acquire script, which knows
// a key held by shared leases; nothing of Redlock writes one.)
//
// # Restarts: delay them
//
// A node that crashes and comes back empty (no persistence, or
// appendfsync other than always) at once can let a second client win a
// majority while the first still holds the lock; the tests show it
// happening. Keep a crashed node out for at least the longest TTL in use
// (delayed restart), or run it with appendonly yes and appendfsync always.
//
// # Clients
//
// The clients are the caller's: *goredis.Client for each master
// (Ring and Cluster clients are refused: each node must be one independent
// master), with ContextTimeoutEnabled set, so that the per-node timeout
// cuts a slow round trip on the socket (New refuses a *goredis.Client
// without it). Clients built from a URL have it set.
//
// go-redis closes a connection whose command timed out. Over a link slower
// than the per-node timeout, a new connection's handshake does not finish
// in time either, so the release after a failed attempt reaches a slow node
// only on a connection already open in the pool; otherwise the key the late
// SET made there stays until its TTL (it only delays later grants, as a
// lock held by nobody would). Calls queued together for a node go out as
// one pipeline, and go-redis (v9.23) takes a pipeline's connection from a
// pool of its own (Options.PipelinePoolSize; it never opens connections
// ahead), not from the pool a lone command uses: connections opened by
// lone commands do not serve pipelined clean-ups. A client with
// PipelinePoolSize set to -1 sends pipelines on its one pool.
//
// # Permissions
//
// A least-privilege ACL user needs, on every node, on keys and channels
// under the prefix (dlock: here), the commands the backend sends and those
// its Lua scripts call (Redis checks those too):
//
//	ACL SETUSER locker reset on >pw ~dlock:* &dlock:* +evalsha +eval +script|load +get +set +del +append +incr +pexpire +pttl +time +publish +subscribe +unsubscribe +ping
//
// Mind the channels (&dlock:*): Redis 7 gives a new user none, and
// without them waiters are never woken by a release. [NewDriver] (so
// [New] and Open) loads the scripts and checks these rights on every node
// that answers within 4 × NodeTimeout (at least 2s; a node that does not
// is left unchecked, with a warning), on a probe key and channel under
// the prefix (one pipelined round trip after the script loads, and a
// SUBSCRIBE and UNSUBSCRIBE on a pub/sub connection of its own), and
// refuses a node whose user lacks one with an error wrapping
// [backend.ErrInvalidConfig] that names the node, the right and the rule
// that grants it. Rights taken away later are errors, not hangs: a node
// that refuses a script fails that call (counted as a failed node); a
// refused SUBSCRIBE fails that node's watch (without a majority of
// watches the waiter polls, with a warning on the Locker's Logger); a
// release whose PUBLISH is refused still deletes the lock there and counts
// as released (logging a warning).
//
// # URL
//
//	redlock://[[user]:password@]h1:6379,h2:6379,h3:6379[/db]?ttl=10s&prefix=dlock:&drift_factor=0.01&node_timeout=50ms&dial_timeout=5s
//
// The credentials and database apply to every node; every node needs a
// host and a port from 1 to 65535 (default 6379). Parameters: ttl (every
// backend), prefix, drift_factor (above 0, below 0.5), node_timeout, and
// dial_timeout (default 5s): Open pings every node and fails, by then, with
// each failed node's error (and its last dial error) unless a majority
// answered. Bad values and unknown parameters are errors wrapping
// [backend.ErrInvalidConfig], before any I/O. The prefix must not contain
// '{' or '}'.
//
// # TLS
//
// redlocks:// dials every node over TLS and verifies each node's
// certificate, against the system's CAs by default, for the host dialled:
//
//	redlocks://:password@h1:6380,h2:6380,h3:6380?ca=/etc/redis/ca.pem
//
// Its parameters (redlocks only; those of rediss:// in the redis backend),
// the same for every node:
//
//   - ca: a PEM file of the CAs to trust instead of the system's (a private
//     CA);
//   - cert and key: PEM files of a client certificate and its key (both or
//     neither), for nodes that ask for one;
//   - server_name: the name to verify in every node's certificate (default
//     each node's host);
//   - skip_verify=true: INSECURE. No node's certificate is checked at all:
//     anyone on the network path can pose as a node and read the password
//     and every lock. Use ca= for a private CA instead. Open logs a warning
//     on the Locker's Logger when it is set.
//
// A file that cannot be read, holds no PEM certificate, or a cert without
// its key is an error wrapping [backend.ErrInvalidConfig], before any
// other I/O. redlock:// sends the password (AUTH) in clear text to every
// node: Open logs one warning when a redlock:// URL carries a password and
// a node's host is not loopback (localhost, 127.0.0.0/8, ::1).
package redlock
