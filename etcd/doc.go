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
// its own lease and waiters wake at once:
//
//   - A lock named k lives under the directory Prefix + escape(k) + "/",
//     where escape percent-encodes "%" and "/", so no lock's directory is a
//     prefix of another's ("a" and "a/b" do not block each other).
//   - Every acquire grants a fresh etcd lease with the asked TTL (rounded up
//     to whole seconds) and, in one transaction, puts the key
//     dir + lease ID attached to it and reads the oldest key in the
//     directory. Two Leases never share an etcd lease: sharing one (as two
//     Mutexes on one Session do) makes the second lock a no-op.
//   - The oldest key (lowest create revision) holds the lock; the others
//     are the FIFO queue. A waiter watches only its immediate predecessor
//     (no herd effect), from the server's current revision; if the watch's
//     created notice shows a write since the read that found the
//     predecessor, it reads the predecessor once more and goes on if it is
//     gone. A watch from a revision the server has already passed
//     (concurrency.Mutex's, or one from the read's revision + 1 when
//     another write lands before the watch is registered) is put in etcd's
//     "unsynced" group, served every 100 ms. On etcd 3.7 this one never is;
//     etcd 3.5 and 3.6 read the current revision just before registering
//     a watch without a start revision, so a write in that instant still
//     makes it unsynced, rarely (the event then comes up to 100 ms late,
//     none is missed). So a waiter wakes within a round trip of the
//     release (BenchmarkHandoffLatency: no handoff over 50ms, where ~6%
//     were before).
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
//   - TryAcquire joins the queue and, if it is not first, revokes its lease
//     at once. A cancelled or failed Acquire revokes its lease too, which
//     deletes its waiter key.
//   - Release deletes the key in a transaction that compares its create
//     revision only (so it never deletes a newer holder's key, and finds
//     the key whichever lease it is on), then revokes the lease. Releasing
//     a lost lease returns ErrNotHeld. If the delete fails (Release's ctx
//     had ended already, or the cluster did not answer within
//     RequestTimeout), the lease is revoked all the same, with a
//     context of its own (2s, then retried in the background until the TTL
//     has passed), which deletes the key: the lock is not left held for the
//     rest of its TTL. Release still returns the delete's error; it can
//     then take RequestTimeout plus 2s.
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
// reports the TTL the server granted; Limits().MinTTL is 1s. Lease.Deadline
// counts from the moment the grant, or the waiter's last keepalive, was
// sent, less the drift margin.
//
// Refresh with the TTL the lease was granted with sends one keepalive.
// etcd cannot change a lease's TTL, so Refresh with another TTL grants a new
// lease and moves the key onto it (a transaction that checks the key is
// still ours; the create revision, and so the token, stays), then revokes
// the old one. Both confirm the key is still ours. If the move's answer is
// lost, Refresh reads the key to learn which lease it is on and revokes the
// other; if that read fails too, Refresh returns the error, and the new
// lease is remembered: Release revokes both.
//
// Each Lease watches its own key: its deletion (the lease expired, was
// revoked, or someone deleted the key) fires Done with ErrLeaseLost, usually
// before the local deadline. The watch ends with the report (no watcher is
// left on the server), or at Release. A watch on a member that froze (see
// Failures) reports nothing: Done then comes from a refresh that finds the
// key gone, or at the local deadline. Without AutoRefresh the lease simply
// runs out at its TTL, as on every dlock backend.
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
// stays silent: a waiter then goes on through its periodic re-read (above),
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
// Parameters: ttl (every backend), dial_timeout (default 5s),
// request_timeout (default 5s); for etcds (TLS): ca, cert, key (PEM
// files; cert and key go together) and server_name. Unknown parameters are an error. A client built from a URL
// is closed when the Locker is.
package etcd
