// Package redis is the dlock backend for a single Redis deployment: one
// server, a primary with replicas behind Sentinel, or a Redis Cluster, all
// through a go-redis [goredis.UniversalClient] (not a [goredis.Ring], which
// moves keys between shards).
//
//	client := goredis.NewClient(&goredis.Options{Addr: "localhost:6379"})
//	locker, err := redis.New(ctx, client, nil)
//
// or, configuration-driven (the import registers the schemes "redis" and
// "rediss"):
//
//	import _ "github.com/dlock-go/dlock/redis"
//	locker, err := dlock.Open(ctx, "redis://:secret@localhost:6379/0?ttl=10s&prefix=app:")
//
// # What it is for
//
// This is an efficiency lock: it stops two processes from doing the same
// work at the same time in normal operation, cheaply (one round trip to
// acquire, one to release, waiters woken by pub/sub on release). It is NOT
// safe for correctness. Redis replicates asynchronously, so a failover can
// promote a replica that never saw a lock and grant it again; a server
// restart without persistence forgets every lock; the lease is a TTL, so a
// holder paused longer than its TTL (GC, swap, a stopped VM) or a server
// clock that jumps forward can let two holders overlap. If a double holder
// would corrupt data, use the etcd or zookeeper backend, and have the
// protected resource check fencing tokens.
//
// # How it works
//
// A lock on key k lives at the Redis key Prefix+"{"+k+"}" (the braces make
// a Cluster hash tag, so the lock key, its fencing counter
// Prefix+"{"+k+"}:fence" and its release channel Prefix+"{"+k+"}:released"
// all belong to one slot). Keys that begin with "}" are rejected (they would
// make an empty hash tag), and so is a Prefix containing "{" or "}".
//
//   - Acquire is one EVALSHA of acquire.lua: SET key value NX PX ttl GET
//     and, if that took the lock, the token: the larger of the key's
//     fencing counter + 1 and the server time in microseconds, written back
//     to the counter (see Fencing tokens). The value is the holder
//     description (dlock.AcquireOptions.Holder, at most
//     [backend.MaxHolderLen] bytes; nothing when it is empty) followed by
//     the ownership part, 16 bytes from crypto/rand as 32 lower-case hex
//     digits, unique per grant. The holder is thus stored with the lock,
//     atomically with the grant, and lasts exactly as long; the scripts
//     compare whole values, so it changes nothing in who owns the lock.
//     [Driver.Inspect] returns it in LockInfo.Holder: what precedes the
//     ownership part ("" for a value of another form, planted by something
//     else). The ownership part comes last so that a value ends with '+'
//     only when it is marked (below), whatever the holder's last character
//     (a holder "C++" would otherwise pass for a mark and its release
//     would go unpublished). When the key is held, the script
//     returns its PTTL, which the dlock layer uses to bound its wait
//     ([backend.HeldError]). The script may safely run twice: a resent
//     acquire (go-redis retries commands after network errors) finds the
//     lock holding its own value and returns the token of the first run
//     (writing the counter again, so that a WAIT after it still counts; see
//     Replication).
//   - A failed acquire marks the lock as waited for: it appends "+" to
//     the holder's value (once; APPEND keeps the TTL). The holder's
//     scripts accept its value with or without the mark.
//   - Release is one EVALSHA of release.lua: compare-and-delete and, only
//     if the lock was marked, PUBLISH on the key's release channel so that
//     waiters wake at once. An uncontended release thus costs the server
//     what a plain compare-and-delete costs. A waiter subscribes before the
//     attempt that marks, so no release it waits for goes unpublished.
//   - Refresh is compare-and-PEXPIRE (refresh.lua); it never re-creates a
//     key that is gone. The Locker's watchdog refreshes the auto-refreshed
//     leases that come due together through [Driver.RefreshBatch]
//     ([backend.BatchRefresher]): one round trip per batch, one script
//     (refreshmany.lua) per 1,000 leases on a single primary, one
//     refresh.lua per lease in one pipeline on a Cluster.
//   - Waiting ([backend.Waiter]) uses one pub/sub connection per Driver,
//     shared by all keys being waited on in this process.
//
// # Concurrent callers: shared pipelines
//
// The acquires and releases of goroutines that share one Driver (one
// Locker) go to the server together: a script call that finds another
// acquire or release of the driver in flight joins a queue, and a flusher
// goroutine (at most four per Driver at a time, started on demand and gone
// when the queue is empty) sends everything queued as one go-redis
// pipeline on the driver's client (a group commit). Under load this cuts
// the system calls, on both sides, from a few per command to a few per
// pipeline (measured: about half the client and server CPU per lock cycle
// at 16 goroutines; see BenchmarkCycle). A lone call, the only one in
// flight, goes straight to the client as before, so a single caller pays
// no goroutine handoff. Refreshes (they are batched already, see
// [Driver.RefreshBatch]) and acquires with WaitReplicas (WAIT must follow
// the script on its connection) are never queued.
//
// The trade-offs of a queued call:
//
//   - Its context bounds the caller's wait, not the pipeline: a caller
//     whose context ends returns at once, while its command, already sent
//     or queued, may still run. A cut acquire's clean-up first waits for
//     that command (within its 2 s bound), then cleans up (see Acquires
//     cut short) only if the acquire may have taken the lock; if the
//     command's pipeline has not run by then (a slow server, or go-redis
//     resending it after a lost reply), the flusher cleans up once the
//     pipeline has run ([Driver.Close] waits for that, up to 2 s). A
//     pipeline that fails (a read timed out with its callers' deadline, a
//     connection lost) may still reach the server after its callers have
//     cleaned up: their tombstones refuse its acquires then. The pipeline's
//     own context ends with the latest deadline of its callers' contexts
//     when they all have one, and at [Driver.Close]; one caller's
//     cancellation never fails the others' commands.
//   - go-redis hooks see a pipeline (ProcessPipelineHook) whose context is
//     the driver's, not the caller's, so a tracing hook does not parent
//     the command to the caller's span.
//   - A pipeline that fails on a network error is resent whole by
//     go-redis (MaxRetries), as a single command would be: the acquire
//     script is safe to run twice; a resent release reports
//     [backend.ErrNotHeld] (see Timeouts and retries).
//   - A reply of NOSCRIPT (a flushed script cache) sends that call again,
//     alone, with EVAL.
//
// Scripts are loaded at [New] and run by EVALSHA, falling back to EVAL if the
// server's script cache was flushed (a restart, a failover). The backend
// needs Redis 7.0 or later (SET with both NX and GET; TIME before a write in
// a script, which relies on scripts replicating their effects).
//
// # Shared leases
//
// The backend serves shared leases ([backend.Guarantees].Shared): a permit
// of a counting semaphore (dlock.AcquireOptions.Permits) and a reader's
// lease of a read-write lock (AcquireOptions.Shared). A plain acquire of
// such a key is the writer: it excludes them all.
//
// Data layout. While key k is held by shared leases, its lock key
// Prefix+"{"+k+"}" holds a marker instead of a grant's value: a NUL byte,
// 's', the permits (0 for readers), ':' and the writer's time (below), in
// server milliseconds, followed by the waited-for mark '+' once a waiter
// has marked it. Beside it, in the same hash slot, Prefix+"{"+k+"}:holders"
// is a sorted set with one member per lease, its value (the holder
// description and the ownership part, as an exclusive lock's value),
// scored by its expiry in server milliseconds (TIME plus the TTL); and
// Prefix+"{"+k+"}:tokens" is a hash of each lease's fencing token. A lease
// is valid while the server clock reads before its score; every script
// first prunes the members whose score has passed. The holders and tokens
// keys expire (PEXPIREAT) at the highest score, so neither outlives its
// holders, and so does the lock key, or at the writer's time (below) if
// that is later. No grant's value begins with a NUL byte (a holder
// description is
// printable), so an exclusive acquire's SET NX fails on the marker as on
// any holder's value: the exclusive path is what it was, without a command
// more, and an exclusive lock has no holders or tokens key.
//
// The grant rule. A shared acquire is one EVALSHA of acquireshared.lua
// (in the shared pipelines, and followed by WAIT with WaitReplicas, as an
// exclusive acquire). It is granted when the key is free (its holders all
// expired, and no writer's time to come), or when it is held by shared
// leases of the same Permits with fewer than Permits holders (any number
// of readers) and no writer waits.
// A request whose Permits differ from the holders' fails at once with a
// *[backend.PermitsError] and writes nothing. Otherwise (an exclusive
// holder, a full semaphore, a waiting writer) it marks the lock key as
// waited for and returns a [backend.HeldError] whose RetryAfter is the
// exclusive holder's PTTL, the time until the first shared holder
// expires, or until the writer's time (at least 1 ms: a refusal by a key
// in its last millisecond makes the waiter try again right after it,
// rather than after its fallback poll, and mark what holds the key then).
// The script is safe to run twice: a resent acquire finds its own member
// and returns the first run's token.
//
// Writers are not starved. An exclusive attempt of a waiting Acquire
// ([backend.Request].Wait > 0: acquire.lua's fifth argument, sent with
// those attempts only) that finds the marker writes the writer's time,
// now + Wait (2 × the Locker's RetryMax), into it, and makes the lock key
// live until then at least: until then shared requests are refused,
// whether the readers it waited for are still there or not (the backend
// package's Shared leases: the reservation holds for Wait "even once the
// readers are gone"). A TryAcquire writes nothing. The writer's own
// RetryAfter is the time until the last shared holder expires, when the
// key can be its. When the last shared lease ends before the writer's
// time, by release or by expiry, the lock key stays a reservation for
// writers until then (after a release, a NUL byte, 'w' and the time;
// after an expiry, the marker with no valid holder): the next exclusive
// acquire, a TryAcquire as well, takes it as it takes a free key (keeping
// the waited-for mark, so that its release wakes the refused readers),
// and shared ones wait. A writer that gives up thus keeps readers out for
// at most Wait after its last attempt.
//
// Release and refresh. Release (releaseshared.lua) removes the lease's
// member if it is still valid by the server clock (else [backend.ErrNotHeld],
// changing nothing); the last holder out deletes the three keys, or leaves
// the reservation. Refresh (refreshshared.lua) moves a valid member's score
// to now + TTL and the keys' expiry with it (the lock key's no earlier than
// the writer's time); it never re-creates a lease. [Driver.RefreshBatch] refreshes shared leases with
// refreshmanyshared.lua (one call per 1,000 leases; one refreshshared.lua
// per lease on a Cluster).
//
// How waiters wait. As for an exclusive lock ([backend.Waiter]): a
// waiting Locker watches the key's release channel and marks the lock key
// with its failed attempt, and a release of a marked key (shared or
// exclusive) publishes on the channel. Every Locker that watches the key
// wakes and makes one attempt: the herd is one attempt per waiting Locker,
// not one per waiter, since a Locker's waiters for one key take turns (the
// dlock layer's line). With one permit freed and many Lockers waiting, one
// attempt wins and the others find the semaphore full again and wait for
// the next release (or their fallback poll, RetryAfter or RetryMax).
//
// Fairness. None across processes: whichever attempt reaches the server
// first after a release wins (Guarantees().FIFO is false). A Locker's own
// waiters are served in arrival order by the dlock layer. Writers are
// preferred as described above.
//
// Tokens. acquireshared.lua issues its token as acquire.lua does (the
// larger of the counter + 1 and the server clock, written back to the
// same counter key, Prefix+"{"+k+"}:fence"), so tokens increase over all
// grants on a key, shared and exclusive, with the limits that Fencing
// tokens describes. [Driver.Inspect] reports every valid lease in
// LockInfo.Holders (oldest grant first, each with its token, TTL and
// holder), with Shared and Permits; [Driver.Keys] lists shared keys (and
// keys reserved for a writer) with the others.
//
// # Timeouts and retries
//
// go-redis applies a context's deadline and cancellation to socket reads
// and writes only when the client's ContextTimeoutEnabled option is set;
// otherwise its ReadTimeout and WriteTimeout (go-redis's default: 5 s) bound each
// attempt, and MaxRetries (3 by default) resends a command after a network
// error. Clients built from a URL set ContextTimeoutEnabled; set it on
// clients you pass to [New] so that a cancelled Acquire returns promptly.
// A Release whose reply was lost and that go-redis resent reports
// [backend.ErrNotHeld] although the first attempt deleted the lock: the
// second run finds the key gone and cannot tell that it was ours.
//
// # Acquires cut short
//
// An acquire whose caller gives up before its reply comes (its context
// ends, a network error, too few replicas for WAIT) may have taken the
// lock, or may take it still: its command can be on its way after
// TryAcquire has returned (in the client's socket buffers, retransmitted
// by TCP, held by a loaded link or proxy, in a pipeline that go-redis
// resends after a timeout). The driver cleans up at once (bounded by 2 s,
// whatever the context), on another connection, so nothing orders the
// clean-up after the acquire. The clean-up (forsake.lua, forsakeshared.lua)
// therefore does two things in one script: it deletes the lock (or ends
// the shared lease) if the acquire took it, and it leaves a tombstone of
// the acquire's value (its ownership part) in the key's fencing counter,
// after the counter's number; a grant whose value has a tombstone is
// refused (acquire.lua and acquireshared.lua put back what they took).
// Whichever reaches the server first, the cut acquire leaves nothing
// behind: no lock, permit or reader's place held for its TTL by nobody,
// exclusive and shared alike.
//
// The limits, honestly: a tombstone is in force for one minute (longer
// than go-redis's resends with its default timeouts, and than several TCP
// retransmissions); an acquire that arrives later still takes the lock
// for its TTL, as does one whose clean-up never reached the server (cut
// off for longer than the 2 s bound). A key keeps at most 64 tombstones,
// the oldest going first (more than 64 acquires of one key cut within a
// minute). The uncontended path pays nothing: an acquire runs the same
// commands as before (every grant reads and writes the counter anyway, and
// a counter with tombstones is not a number, which only then makes the
// script look further); while tombstones are in force on a key, its grants
// rewrite them with the token (a few string operations, and a SET more).
// [Driver.Inspect] reports the counter's number; a tool of your own that
// reads the counter must take the digits before the first '!'.
//
// # TTLs
//
// Redis expires keys in whole milliseconds. A TTL that is not a whole number
// of milliseconds is truncated down to one (the conservative direction: the
// lease never outlives what the holder believes), and the truncated value is
// what [backend.Lease.TTL] and Refresh report. The shortest TTL is 1 ms; the
// dlock layer may impose a higher floor.
//
// # Fencing tokens
//
// Tokens come from a counter per key, Prefix+"{"+k+"}:fence". Each grant,
// in the same script that takes the lock, issues as its token the larger of
// the counter + 1 and the server clock in microseconds (TIME; about 1.8e15
// today), and writes it back to the counter. So every token is above the
// counter the server has, and at least the server's clock. (The counter's
// value is that number, followed by the tombstones of acquires cut short
// while any are in force: see Acquires cut short.)
//
// The counter alone would not do: a counter that is lost or comes back
// stale (a restart without persistence, or from an RDB snapshot or an AOF
// fsynced every second that missed the last grants; a failover to a
// replica that missed them; an eviction; a DEL) would hand out earlier
// tokens again, and the lock keys taken since are lost with it, so a
// second holder could get a token equal to or below the first's. The
// clock under every token closes that while the clock moves forward.
//
// The counter keys do not pile up (one per distinct lock name, forever):
// when a grant's token is the clock (the usual case), the counter is
// written with an expiry, [Options].FenceRetention (default 24 h, URL
// parameter fence_retention) after the lock's TTL, counted from the grant.
// Every later grant issues at least the server clock, which is past that
// token once the counter is gone, unless the clock stepped back by more
// than the time since the grant (at least the TTL + FenceRetention). A
// counter at or ahead of the clock (a burst of grants within a
// microsecond, a counter set by hand or by a server with a faster clock, a
// clock stepped back) is kept without expiry, since until the clock passes
// it only the counter orders the tokens; the next grant whose token is the
// clock gives it an expiry again. A lock refreshed beyond its first TTL +
// FenceRetention outlives its counter, which is harmless: the next grant
// comes after the lock ends and issues at least the clock. A negative
// FenceRetention (fence_retention=never) keeps every counter forever.
//
// What remains, in one statement (Guarantees().Notes and the README say the
// same): Each token is the larger of the server's counter + 1 and its clock
// in microseconds, written back to the counter. A token can equal or go
// below an earlier one only if the counter was lost or came back stale (a
// restart without persistence, or from a snapshot or an appendfsync everysec
// file that missed the last grants; a failover to a replica that missed
// them; an eviction; a DEL; its expiry, FenceRetention after the lock's TTL
// when the grant's token was the clock) and the serving server's clock reads
// behind that earlier token: stepped back by more than the time since that
// grant (an outage included), behind the old primary's clock by more than
// the time between the two grants (a promoted replica), or behind a token
// that came from a counter set ahead of the clock (by hand, or by a server
// with a faster clock).
// Tokens are exact decimal strings in the scripts, also beyond 2^53.
// Hence [backend.FencingBestEffort]: use etcd or ZooKeeper where a
// repeated token would be a correctness problem.
//
// # Replication (WAIT)
//
// With [Options].WaitReplicas > 0, the acquire script and WAIT numreplicas
// timeout go to the server in one pipeline on one connection (WAIT counts
// acknowledgements of that connection's writes). If fewer replicas
// acknowledge in time, the lock is released again and the attempt fails
// with an error wrapping [backend.ErrUnavailable] (Acquire tries again up
// to three times in a row). WAIT narrows, but does
// not close, the failover window: Redis may still promote a replica that did
// not acknowledge. Only acquires wait; refreshes and releases do not (a
// refresh lost in a failover shortens a lease that the old primary already
// granted; it cannot create a second holder that WAIT on the acquire would
// have prevented). WaitReplicas is refused for a Cluster client, whose
// pipelines split commands by key slot: WAIT has no key, so it cannot be
// made to run on the connection that wrote the lock. An acquire's TTL must
// be longer than WaitTimeout ([New] and Open refuse a Locker TTL that is
// not, before any I/O; an acquire asking for one fails with
// ErrInvalidTTL), and WaitTimeout must be below the client's ReadTimeout
// ([New] refuses it otherwise): a WAIT reply later than the read deadline
// would make go-redis resend the whole pipeline. A resent
// acquire script that finds the lock already its own writes the counter
// again (the same value), so that the resent WAIT still waits until the
// replicas have the lock: since Redis 7.2, WAIT counts only the writes of
// its own connection, and a resent script that wrote nothing would let
// WAIT return at once.
//
// # Eviction
//
// A lock key evicted under memory pressure is a lock silently granted
// twice. [New] therefore reads maxmemory-policy (on every shard of a
// Cluster) and, by default, refuses anything but "noeviction"
// ([EvictionRefuse]); see [Options].EvictionCheck. It refuses as well when
// it cannot read the policy (CONFIG GET forbidden by an ACL, renamed or
// disabled, as on some managed services): allow the client CONFIG GET, or,
// knowing the policy is noeviction, set EvictionCheck to [EvictionWarn] or
// [EvictionIgnore] (eviction_check=warn or ignore in a URL).
//
// # Permissions
//
// A least-privilege ACL user needs, on keys and channels under the prefix
// (dlock: here), the commands the backend sends and those its Lua scripts
// call (Redis checks those too):
//
//	ACL SETUSER locker reset on >pw ~dlock:* &dlock:* +evalsha +eval +script|load +get +getrange +strlen +set +del +append +incr +pexpire +pexpireat +pttl +time +zadd +zrem +zscore +zrange +zcard +hset +hget +hgetall +hdel +publish +subscribe +unsubscribe +ping +config|get
//
// (the sorted-set and hash commands and PEXPIREAT are those of the
// shared-lease scripts, see Shared leases; they are checked whether or not
// the program takes shared leases; GETRANGE, STRLEN and HGETALL are those
// of [Driver.Inspect], which reads a lock in one script, so needs neither
// MULTI nor EXEC), plus +wait with WaitReplicas
// (wait_replicas), and less +config|get with
// EvictionCheck warn or ignore. Mind the channels (&dlock:*): Redis 7
// gives a new user none, and without them waiters are never woken by a
// release. [NewDriver] (so [New] and Open) checks these rights on a probe
// key and channel under the prefix (one pipelined round trip, and a
// SUBSCRIBE and UNSUBSCRIBE on a pub/sub connection of its own) and
// refuses a user that lacks one with an error wrapping
// [backend.ErrInvalidConfig] that names it and the rule that grants it
// (on a Cluster, on the node serving the probe key; give every node the
// same ACL). Rights taken away later are errors, not hangs: a refused
// SUBSCRIBE fails the watch (the waiter then polls, with a warning on the
// Locker's Logger), and a release whose PUBLISH is refused still deletes
// the lock and returns nil (logging a warning: waiters find the lock free
// when they next poll).
//
// # URL
//
// The schemes are redis:// (plain TCP) and rediss:// (TLS):
//
//	redis://[[user]:password@]host[:port][/db][?param=value&...]
//
// One host is required (no localhost default), with a port from 1 to 65535
// (default 6379). ACL user, password and database are parsed by
// [goredis.ParseURL]. The backend's own parameters are prefix, wait_replicas,
// wait_timeout (a Go duration such as 250ms), fence_retention (a Go
// duration of at least 1ms, or never), eviction_check (refuse, warn or
// ignore) and dial_timeout (default 5s): the bound on Open's first round
// trip (the eviction check and the script loads, dials and go-redis's
// retries included), also go-redis's DialTimeout; when it runs out the error
// says so and carries the last dial error (connection refused, x509, ...).
// The go-redis client parameters are passed through after a check here:
// client_name, protocol (2 or 3), db, max_retries (-1 or more),
// pool_size, min_idle_conns, max_idle_conns, max_active_conns,
// max_concurrent_dials (0 to 65536), pipeline_pool_size (-1 to 65536),
// pipeline_read_buffer_size and pipeline_write_buffer_size (0 to 64 MiB),
// the durations min_retry_backoff, max_retry_backoff, read_timeout,
// write_timeout, pool_timeout, conn_max_idle_time (idle_timeout),
// conn_max_lifetime (max_conn_age), conn_max_lifetime_jitter, and the
// boolean pool_fifo. A malformed query, a value out of range and an
// unknown parameter (whose error lists the known ones) are errors wrapping
// [backend.ErrInvalidConfig], before any I/O. The client built from a URL
// is closed by the Locker's Close; a client passed to [New] is never
// closed.
//
// # TLS
//
// rediss:// verifies the server's certificate, against the system's CAs by
// default, for the host dialled:
//
//	rediss://:password@redis.internal:6380/0?ca=/etc/redis/ca.pem&cert=client.pem&key=client-key.pem
//
// Its parameters (rediss only; the same as etcds:// in the etcd backend):
//
//   - ca: a PEM file of the CAs to trust instead of the system's (a private
//     CA);
//   - cert and key: PEM files of a client certificate and its key (both or
//     neither), for a server that asks for one (tls-auth-clients);
//   - server_name: the name to verify in the server's certificate (default
//     the host dialled);
//   - skip_verify=true: INSECURE. The server's certificate is not checked
//     at all: anyone on the network path can pose as the server and read
//     the password and every lock. Use ca= for a private CA instead. Open
//     logs a warning on the Locker's Logger when it is set.
//
// A file that cannot be read, holds no PEM certificate, or a cert without
// its key is an error wrapping [backend.ErrInvalidConfig], before any
// other I/O. A certificate that does not verify fails Open with
// [backend.ErrUnavailable] and the x509 error ("certificate signed by
// unknown authority": give ca=). redis:// sends the password (AUTH) in
// clear text: Open logs a warning when a redis:// URL carries a password
// and its host is not loopback (localhost, 127.0.0.0/8, ::1).
package redis
