// Package etcd is the dlock backend on etcd v3: consensus-grade locks whose
// fencing token is the create revision of the holder's key. Choose it where
// two holders at once would corrupt data.
//
//	client, _ := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
//	locker, err := etcd.New(ctx, client, nil)
//	...
//	lease, err := locker.Acquire(ctx, "orders/42", nil)
//
// or, by configuration, dlock.Open(ctx, "etcd://h1:2379,h2:2379,h3:2379/locks?ttl=15s")
// after importing this package (see the URL section below).
//
// # The recipe
//
// This is etcd's concurrency.Mutex recipe, written out so that each lock has
// its own lease, a lock cycle costs the same two Raft writes as a Mutex on a
// reused Session, and waiters wake at once:
//
//   - A lock named k lives under the directory Prefix + escape(k) + "/",
//     where escape percent-encodes "%" and "/", so no lock's directory is a
//     prefix of another's ("a" and "a/b" do not block each other).
//   - Every acquire takes an etcd lease of the asked TTL (rounded up to
//     whole seconds) and, in one transaction, puts the key dir + lease ID
//     attached to it and reads the oldest key in the directory. The key's
//     value is the acquire's holder description
//     (dlock.AcquireOptions.Holder; empty without one), so it is stored
//     atomically with the grant, at no cost in requests; a Refresh that
//     moves the key to a new lease writes it again. Two Leases
//     never hold one etcd lease at once: sharing one (as two Mutexes on one
//     Session do) makes the second lock a no-op.
//   - The etcd lease comes from the Driver's pool when it has one of that
//     TTL: a Release deletes its key and keeps the lease, now without a
//     key, for the next grant of the same TTL (at most 64 per TTL; one left
//     unused for 30s is revoked when the pool is next used, and Close
//     revokes the pool). Pooled leases are not kept alive: an acquire that
//     takes one sends a keepalive (on the Driver's keepalive stream, not a
//     Raft write) at the same time as its put, and the grant's TTL (the
//     TTL the server granted the lease) and Deadline count from that
//     keepalive's sending; unless the lease was renewed (or granted) within
//     the last tenth of the TTL the server granted it, by the lock it
//     carried just before: then the put goes alone, and the grant's TTL is
//     the TTL the server granted the lease, counted from that renewal's
//     sending (Lease.TTL is the full TTL; at least nine tenths of it is
//     left at the acquire; its Deadline is that renewal's sending plus the
//     TTL granted, less the drift margin). A pooled lease that may
//     have run out by our count is not used; one that ran out anyway (the
//     put fails with "lease not found", or the keepalive finds it gone) is
//     dropped and the acquire takes another lease or grants a new one.
//     Without a pooled lease, the acquire grants one first (a Raft write).
//     Each etcd lease of ours has one owner and is in one of four states:
//     in use (a key of ours is on it), idle (in the pool), revoking, or
//     gone. Once a revoke of a lease has started (and a failed one is
//     retried in the background until the lease has run out), the lease
//     never goes back to the pool: a Release after a failed one deletes
//     the key, if it is still there, and leaves the lease to that revoke,
//     so no later grant can be on a lease that is being revoked.
//   - The oldest key (lowest create revision) holds the lock; the others
//     are the FIFO queue. A waiter waits only for its immediate
//     predecessor's delete (no herd effect: the others are not woken).
//     (Shared leases follow the same recipe with another grant rule: see
//     Shared leases below.)
//   - Each Driver watches the directory of each lock it uses (deletes
//     only): one watch per directory, shared by all its leases and waiters
//     there, so that a release reaches the Drivers that use that lock, not
//     every Driver under the prefix. Past 64 directories in use, one watch
//     on the whole prefix serves the rest. A directory's watch lingers for
//     30s after its last lease or waiter, for the next acquire of that
//     lock; the first acquire of a lock whose directory is not watched
//     yet reads its key once more after its put, since the watch may not
//     be in force. The watches are made without a start revision, so that
//     they are in etcd's synced group and a delete reaches them within a
//     round trip. (A watch from a revision
//     the server has already passed, as concurrency.Mutex's is, goes to
//     etcd's "unsynced" group, served every 100 ms: the ~90 ms handoff p99
//     of BenchmarkHandoff's mutex case.) A watch dispatches each delete to
//     the lease whose key it deletes (a loss, see below) and to the waiter
//     whose predecessor it deletes. A waiter registers its interest before
//     each read of its queue, so a delete after the read is never missed.
//     When a watch breaks (a compaction, a member that lost its leader:
//     the watch requires one), every waiter reads its queue again, and
//     once the watch is made again the held keys are read (in transactions
//     of up to 100 reads) and those gone reported lost. No goroutine and
//     no server-side watcher per lease or waiter: one per directory.
//   - While queued, the waiter keeps its own lease alive. When no older
//     key is left, it checks that its own key still exists: a waiter whose
//     lease expired while queued fails, it is never granted the lock
//     (etcd issues #11456, #19597). A waiter that gets no keepalive
//     answered for its TTL (its member is cut off from the others, or the
//     cluster has no quorum) fails then too, with ErrUnavailable, since its
//     lease may have expired. Watches require a leader
//     (clientv3.WithRequireLeader): a member without one cancels them
//     instead of leaving a waiter or a holder's loss watch hanging on it.
//     A frozen member (a stopped process, a host that answers nothing but
//     keeps its connections open) cancels nothing, so a waiter also reads
//     its predecessor again after each answered keepalive (every third of
//     its TTL): it goes on within about that period of the release even if
//     its watch is dead. Each request it makes while queued is bounded by
//     a third of its TTL (at least 1s, at most RequestTimeout) and sent
//     again, to the next member, if it is not answered; a failed read (an
//     election, say) is retried after a pause: Acquire then fails only
//     when ctx ends or the keepalive gives up (above).
//   - TryAcquire joins the queue and, if it is not first, deletes its key
//     at once (its lease goes back to the pool; if the delete fails, the
//     lease is revoked). A cancelled or failed Acquire revokes its lease,
//     which deletes its waiter key.
//   - Release deletes the key in a transaction that compares its create
//     revision only (so it never deletes a newer holder's key, and finds
//     the key whichever lease it is on), and returns: that is its one Raft
//     write. The lease goes back to the pool. Releasing a lost lease
//     returns ErrNotHeld (its lease is revoked in the background). If the
//     delete fails (Release's ctx had ended already, or the cluster did not
//     answer within RequestTimeout), the lease is revoked, with a context
//     of its own (2s, then retried in the background until the TTL has
//     passed, or until the Driver's Close, which makes one last attempt),
//     which deletes the key: the lock is not left held for the rest of
//     its TTL. Release still returns the delete's error; it can
//     then take RequestTimeout plus 2s.
//
// # Shared leases
//
// The Driver serves shared leases (backend.Request.Shared;
// dlock.AcquireOptions.Permits and Shared): permits of a counting
// semaphore and readers' leases of a read-write lock, in the same queue as
// exclusive ones, with the same guarantees.
//
// Layout. A shared entry is a key of the lock's directory, on its own
// lease as every entry is, named dir + "s" + its Permits in 16 hex digits
// + the lease ID in hex (an exclusive one is dir + the lease ID, as before
// shared leases), so that the exclusive entries are the range [dir,
// dir+"g"), the shared ones [dir+"s", dir+"t"), and those of one Permits
// a prefix of that range: a read of one key, or a count, tells whether the
// queue holds an entry of a kind, or a shared entry of another Permits,
// without reading the queue in order. Its value is the byte 0x01, the
// Permits in decimal, ":" and the holder description ("\x014:worker-7");
// a holder description is printable, so it never begins with 0x01, and an
// exclusive entry's value is the holder description alone, as before.
//
// Grant rule. In the queue (entries by create revision), an exclusive
// entry is granted when no entry is ahead of it. For a shared entry e of
// Permits n, with the entries A ahead of it:
//
//   - if a shared entry of A has another Permits than n: if the oldest
//     shared entry of A has another Permits, the acquire deletes e and
//     fails with a *backend.PermitsError naming that entry's Permits;
//     otherwise it waits (for the delete of those entries). The oldest
//     entry of an all-shared A is granted (or is an entry at the head
//     about to leave with a PermitsError of its own); the oldest shared
//     entry behind a writer is granted when the writers ahead of it go
//     (unless it is cancelled).
//     A shared entry of A of another Permits that is not the oldest
//     judged the oldest as e does, and is about to leave with a
//     PermitsError: it is neither evidence of the key's Permits nor
//     compatible with e;
//   - else, if an exclusive entry is in A: e waits (for the nearest
//     writer ahead);
//   - else every entry of A is shared with e's Permits: e is granted if n
//     is 0 (a reader) or A has fewer than n entries; otherwise it waits.
//
// So every entry ahead of a granted entry has its Permits: no two granted
// entries ever differ in Permits, and the granted entries are a prefix of
// the queue, granted in creation order, at most n of them for a
// semaphore. An entry about to leave with a PermitsError (between its
// join and its delete: a round trip, or until its lease runs out if its
// delete and revoke fail or its process dies) can cause at most a wait,
// or, at the head of the queue, a PermitsError that would not come a
// moment later; never a grant beside it. The same rule (one function,
// judge) judges the join and every read of a waiter. The join reads, in
// its transaction, one exclusive entry if any, the number of entries, and
// one key of each range of other Permits than its own: all reads of a few
// keys or counts, none sorted (a transaction with a put runs in etcd's
// apply loop, one at a time, and a read sorted by create revision reads
// the whole range). If it finds a shared entry of another Permits, it
// reads the queue once more as a waiter does, and then the oldest shared
// entry ahead (a sorted read, outside the apply loop): only requests that
// disagree on the Permits pay for these reads. A waiter's read takes the
// nearest entry of each range of other Permits ahead of it as well (empty
// ranges, unless requests disagree).
//
// TryAcquire joins, reads, and leaves (deleting its entry) unless granted,
// as for a mutex. A TryAcquire that is not granted only because of
// entries of another Permits about to leave reports the key as held
// (ErrNotAcquired): a transient answer, as a mutex's TryAcquire racing
// another's is; a later attempt, or Acquire, gets in once they are gone.
//
// Waiting, without a herd. Each waiter reads what decides its turn, in
// one read transaction with its own key, and waits for one of these
// before it reads again:
//
//   - a writer: its immediate predecessor's delete, as above;
//   - a reader behind a writer: the delete of the nearest exclusive entry
//     ahead. The readers behind one writer wake together, and are granted
//     together: no herd;
//   - a semaphore's waiter with a writer ahead and fewer than n entries
//     between them: that writer's delete (at most n wake);
//   - a reader with shared entries of another Permits ahead (about to
//     leave): their deletes;
//   - a semaphore's waiter that reads every entry ahead (at most n, no
//     writer: holders, entries of another Permits about to leave, or
//     waiters about to be granted): the delete of any of them (the first
//     waiter of a semaphore, behind n holders, is such a waiter);
//   - any other semaphore waiter: its immediate predecessor, a waiter too,
//     for a delete or a write. It can be granted, or become the first
//     waiter, only once its predecessor is granted or gone; and a
//     semaphore waiter granted after waiting, with an entry behind it,
//     writes its key once (the same value and lease; a transaction on its
//     create and mod revisions) to tell the next one. That write is the
//     waiter's, before its Acquire returns, and a Refresh after it
//     compares its revision.
//
// A release thus wakes one waiter (the first), and its grant the next: a
// grant costs O(1) requests however many wait — with 1,000 waiters on a
// semaphore of 4, about 5.7 transactions per grant, counting each
// waiter's own join, first read and release (TestSemaphoreDrain logs it
// from the server's metrics). The price is that a semaphore's waiters
// move up one at a time: a waiter is granted after its predecessor's read
// and write, not at the same time; and a waiter granted after waiting
// whose process stalls before that write (a GC pause, a stopped VM, a
// crash) holds back the waiters behind it, free permits or not, until its
// write comes or its lease runs out (at most its TTL once its keepalives
// stop): a known limitation of this scheme, not a safety issue (the
// ZooKeeper backend, whose waiters watch the n entries nearest ahead
// instead, has no such stall). A reader's wake-up (a delete) comes
// from the Driver's watch of the directory, as a mutex waiter's does. That
// watch carries deletes only, so that exclusive locks pay for no puts; a
// semaphore's waiter may wait for a write, so a Driver's semaphore waiters
// of one lock share one watch of its directory (puts and deletes), made by
// the first of them and ended with the last. A broken watch wakes its
// waiters, which read again; a waiter also reads the keys it waits for
// after each answered keepalive (a frozen member); and a cancelled or
// failed waiter revokes its lease: all as for a mutex waiter, in the same
// code.
//
// Fairness and tokens. Grants follow creation order: a writer queued
// behind readers is served when they have gone, and keeps every later
// reader out until it has held (writers are not starved); readers queued
// behind it are then granted together. The token is the create revision,
// as for every lease, so it increases across all grants of the key,
// shared and exclusive: a grant is made only when every entry ahead of it
// is granted or gone (or about to leave with a PermitsError, never
// granted). Shared holders granted together may learn of their grant in
// any order.
//
// Inspect lists every holder (LockInfo.Holders, oldest first) with
// LockInfo.Shared and Permits; Keys lists shared keys as others.
//
// # Inspecting and watching a lock
//
// The Driver is a backend.Inspector: Inspect reads the queue's head (its
// create revision is the token, its value the holder description, its
// lease's time to live the TTL) and counts the waiters behind it, in one
// read and one LeaseTimeToLive. It is also a backend.ChangeWatcher:
// [Driver.WatchChanges] makes one etcd watch on the lock's directory,
// without a start revision (so that it is in etcd's synced group, as the
// Driver's own watches are), and returns once the server has created it; every key
// created or deleted in the directory after that (a grant, a waiter
// joining, a release, an expiry, a waiter leaving) makes its channel
// receive, within a round trip. An observer of a lock (the followers of a
// dlock election) thus learns of a new holder without polling Inspect.
// The channel is closed when the server cancels the watch (a member
// without a leader, a compaction), when the member does not answer a
// progress request within a request timeout (a frozen member: the watch
// asks every request timeout), or at Close; a broken connection is resumed
// by the client without missing a change.
//
// # Fencing token
//
// Lease.Token is the create revision of the holder's key — what
// concurrency.Mutex.IsOwner compares, not the revision of a response
// header. Revisions come from the Raft log: a later holder always has a
// larger token, across leader changes and member restarts. To fence a
// write to etcd itself, put [Ownership.Cmp] in the write's transaction
// ([OwnerOf] gives it for a lease): the write then happens only while the
// lock is still held, with no extra state. For other resources, pass the
// token along and have the resource reject lower ones.
//
// # TTL, Deadline and loss
//
// etcd leases count whole seconds, and the server raises a TTL below its
// floor (1.5 × the election timeout, 2s by default) to the floor. Lease.TTL
// reports the TTL the server granted (for a pooled lease handed out
// without a keepalive, what was left of it: at least nine tenths of that);
// Limits().MinTTL is 1s. Lease.Deadline counts from the moment the grant,
// the keepalive sent with the put of a pooled lease (or, for a lease
// renewed just before, that renewal), or the waiter's last keepalive was
// sent, less the drift margin: never later than the server's expiry.
//
// Keepalives (of queued waiters, of Refresh, of pooled leases at their
// reuse, of RefreshBatch) go on the Driver's four LeaseKeepAlive streams,
// each call's keepalives on one stream (the server answers one stream's
// requests one at a time). A stream that has answered nothing for a second
// while a keepalive on it waits is dropped (the member may be frozen): the
// caller sends its unanswered keepalives again on another stream, while
// the request timeout lasts, and the next keepalive on the dropped slot
// opens another, which the client may send to another member. The reads a
// refresh makes are sent again likewise after a fifth of the request
// timeout (at least a second) without an answer, and again each time
// that passes, the earlier attempts kept: the first answer wins (a failed
// attempt is sent again at once if no other is out).
//
// Refresh with the TTL the lease was granted with sends one keepalive and,
// at the same time, checks in a linearizable read-only transaction that the
// key is still ours on that lease. The Driver is also a
// backend.BatchRefresher: RefreshBatch renews all the leases of one call
// with one keepalive each on one stream and reads their keys at the same
// time (up to 100 in one linearizable transaction), and reports a lease
// lost (ErrNotHeld) if its keepalive finds it gone or the read finds its
// key gone, made again, or on another lease. A key deleted behind our back
// while its lease lives (by an operator, say) is thus reported by every
// refresh that starts after the delete was answered, whichever member the
// client talks to, and often earlier by the watch of its directory, whose
// events come from its member's own state, which may lag the cluster's
// (both reads wait for a read index instead).
// etcd cannot change a lease's TTL, so Refresh with another TTL grants a new
// lease and moves the key onto it (a transaction that checks the key is
// still ours, on the lease we keep alive, and not written since our last
// write to it: its mod revision; the create revision, and so the token,
// stays), then revokes the old one. Both confirm the key is still ours. If
// the move's answer is lost, the transaction may still be in the Raft log
// and commit later, so a read cannot tell which lease the key will be on.
// Refresh settles it with a fencing transaction instead: if the key is
// still ours on the old lease and unchanged, it is put again on the old
// lease (which changes its mod revision, so the lost move can never commit
// after it), else the key is read in the same transaction (the move
// committed, or the key is gone). Refresh then keeps the lease the key is
// on, revokes the other, and returns the move's error. If the fencing
// transaction's answer is lost too, neither lease is revoked, Refresh
// returns the error, and the new lease is remembered: the next Refresh
// (RefreshBatch refreshes such a lease on its own, through Refresh) settles
// first and renews nothing until it has (it fails with ErrUnavailable
// meanwhile, or ErrNotHeld if the key is gone); Release deletes the key
// wherever it is and revokes both. Meanwhile the Lease's Deadline is no
// later than the old lease's expiry, nor than the start of the failed
// Refresh plus the TTL it asked (the new lease, granted after that start,
// lasts at least as long: etcd rounds a TTL up to whole seconds and raises
// one below its floor, never lowers it).
//
// The watch of its directory reports the deletion of a held key (the lease
// expired, was revoked, or someone deleted the key) through the Lease's
// backend.LossNotifier: Done fires with ErrLeaseLost, usually before the
// local deadline. A watch on a member that froze (see Failures) reports
// nothing: Done then comes from a refresh that finds the key gone, or at
// the local deadline. Without AutoRefresh the lease simply runs out at its
// TTL, as on every dlock backend.
//
// # Failures
//
// The etcd client retries a request until a member answers, and a member
// that has lost its quorum may not answer at all: left alone, a call
// without a ctx deadline would wait until the cluster serves again. Every
// request (grant, transaction, read, keepalive) is therefore bounded by
// Options.RequestTimeout (5s by default; URL parameter request_timeout):
// one that is not answered in time fails with ErrUnavailable, and Acquire
// and TryAcquire report it at once (no retry). A failed Release can take
// RequestTimeout plus 2s (the delete, then the revoke; see above). Waiting
// in the queue is not bounded by it: a waiter waits for its turn until ctx
// ends, its lease is lost, or no keepalive of its lease was answered for
// the lease's TTL.
//
// Watches require a leader, so a member cut off from the others cancels
// them. A member that is frozen — its process stopped, or its host gone
// silent without closing connections — cancels nothing, and a watch on it
// stays silent: a waiter then goes on through its read of its predecessor
// after each answered keepalive (every third of its TTL),
// and a holder's Done comes from a refresh or its deadline. The client
// sends each request to the next member in turn, so any single request
// may go to the frozen member and wait for its timeout. gRPC keepalive
// pings find such a member and close its connection, and the client's
// watches move to another member: a client built from a URL pings after
// 10s without traffic and gives up after 5s more; for a client you pass to
// New, set clientv3.Config.DialKeepAliveTime and DialKeepAliveTimeout
// (10s and 5s, say; gRPC allows no less than 10s).
//
// # Guarantees
//
// Fencing is consensus-grade; the lock works while a majority of the members
// is up (it tolerates ⌊(n−1)/2⌋ failures of n, counted at New); waiters are
// served FIFO; safety does not rest on clocks (the server expires leases;
// tokens order holders). As everywhere, a holder paused past its lease may
// act on stale belief until Done fires: check tokens at the resource.
//
// # URL
//
//	etcd://[user:password@]host1:2379,host2:2379[/prefix]?ttl=15s
//	etcds://host1:2379/prefix?ca=ca.pem&cert=client.pem&key=client-key.pem
//
// The path is the key prefix ("/locks" means "locks/"; default "dlock/").
// Every endpoint needs a host and a port from 1 to 65535 (default 2379).
// Parameters: ttl (every backend; at least 1s), dial_timeout (default 5s:
// the bound on Open's first round trip; when it runs out the error carries
// gRPC's last connection error and the last dial error),
// request_timeout (default 5s); for etcds (TLS): ca, cert, key (PEM
// files; cert and key go together) and server_name. Bad values and unknown
// parameters are errors wrapping [backend.ErrInvalidConfig] (a ttl below
// 1s: [backend.ErrInvalidTTL]), before any I/O. A client built from a URL
// is closed when the Locker is.
package etcd
