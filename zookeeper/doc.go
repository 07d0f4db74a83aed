// Package zookeeper is the dlock backend on Apache ZooKeeper (3.5 or later):
// consensus-grade locks whose fencing token is the czxid of the holder's
// lock node, the zxid Kleppmann's article suggests. Choose it where two
// holders at once would corrupt data.
//
//	locker, err := zookeeper.New(ctx, []string{"zk1:2181", "zk2:2181", "zk3:2181"}, nil)
//	lease, err := locker.Acquire(ctx, "orders/42", nil)
//
// or, by configuration, dlock.Open(ctx, "zk://zk1:2181,zk2:2181,zk3:2181/dlock?session_timeout=30s")
// after importing this package.
//
// # The recipe
//
// The lock recipe of Apache Curator's InterProcessMutex, written here rather
// than taken from go-zookeeper's zk.Lock, which takes no context, leaves its
// node behind on errors and cannot recover from a connection lost during the
// create:
//
//   - A lock named k queues under the container node Prefix + "/" +
//     encode(k). Container nodes are removed by the server once empty, so
//     lock names do not pile up; a waiter that finds its parent reaped
//     creates it again.
//   - Each acquire creates an ephemeral-sequential node in protection mode:
//     its name carries a random GUID ("_c_<guid>-lock-<seq>"). If the
//     connection drops during the create, the reply is lost but the node
//     may exist: we list the parent and take the node with our GUID instead
//     of creating a second one (Curator's protection mode; ZOOKEEPER-1262).
//     If even that fails, the acquire fails, and a background task deletes
//     whatever carries our GUID once it can, so no orphan node keeps the
//     lock.
//   - The node with the lowest sequence number holds the lock. Every other
//     waiter watches only its immediate predecessor (no herd effect), so
//     the lock is granted first come, first served. (Shared leases share
//     the queue: see "Shared leases".)
//   - The listing of the queue and a read of our own node (with a watch on
//     it: a child watch, which fires on the node's deletion but not on a
//     write of its data) are sent together, in one round trip after the
//     create: an
//     uncontended acquire takes two round trips, as go-zookeeper's Lock,
//     and Release one (a delete). When we are first, the read's Stat proves
//     the node (owned by our session) still exists, and its czxid is the
//     token.
//   - A cancelled or failed acquire returns at once and deletes its node in
//     the background: the task retries until the node is gone, its session
//     has ended (the server then deletes it) or the Locker is closed
//     (Close waits for it, and ends the session). A TryAcquire that finds
//     the lock held deletes its node before it returns (one delete, given
//     up to a second; after that, in the background), so that its node
//     does not stand before a later TryAcquire once the holder releases.
//
// # Shared leases
//
// Semaphores (dlock.AcquireOptions.Permits) and read-write locks (Shared)
// queue with the exclusive locks, in the same directory, in the manner of
// Curator's InterProcessReadWriteLock, which names a node's kind in its
// name:
//
//   - Layout: the kind is part of the node's name, between the GUID and
//     the sequence number: "_c_<guid>-read-lock-<seq>" for a reader,
//     "_c_<guid>-sem<N>-lock-<seq>" for a permit of a semaphore of N. An
//     exclusive node's name and data are what they always were. The name,
//     not the data, because the one listing a waiter makes anyway tells it
//     every node's kind, where the data would cost a read per node. A node
//     whose name carries no tag we know (another program's recipe, or
//     one planted) counts as exclusive. The data is the holder
//     description, as for an exclusive node. A release of dlock from
//     before shared leases reads the sequence number after "-lock-" as
//     always, and takes a shared node for an exclusive one: it waits for
//     it, never holds beside it.
//   - Grant rule, on the queue in creation order: an exclusive node holds
//     when no node is ahead of it; a shared node when no exclusive node,
//     and no shared node of another Permits, is ahead of it and, for a
//     semaphore, fewer than Permits nodes are (waiters of every kind
//     count). Nodes only ever leave the part of the queue ahead of a node,
//     so a grant is never taken back, and a node that does not hold keeps
//     every node behind it from holding: the holders are always a prefix
//     of the queue. At every moment the key has one exclusive holder, or
//     shared holders of one kind, at most Permits of them.
//   - Mismatch: a shared request that finds the key held by shared leases
//     of another Permits (the head of the queue is one: the holders are
//     all of its kind) deletes its node before it returns (as a TryAcquire
//     that finds the lock held does) and fails with a *backend.PermitsError,
//     at once, without waiting. Only the holders count: a waiter of another
//     Permits ahead of it is no evidence (a request that mismatches is in
//     the queue for a moment before it leaves; one that is granted is then
//     a holder). A request queued behind such a waiter waits with it, and
//     fails once that one holds, when it next looks; but it is woken only
//     by the nodes it watches (below), which need not include the one
//     whose release let the other kind hold: it may then wait out the
//     other kind's whole hold and be granted after it, its mismatch never
//     reported (a known limitation; safe, as it is never granted beside
//     holders of another Permits).
//   - Fairness: FIFO. A reader or a permit queued behind a waiting writer
//     waits for it, so writers are not starved; a writer on a semaphore's
//     key waits for every permit ahead of it, and permits queued behind it
//     wait for it.
//   - Tokens: the czxid, as for a mutex. As the holders are a prefix of
//     the queue, the queue's order is the grants' order, and every grant's
//     token is larger than those of the grants before it, shared and
//     exclusive. Shared leases that one release grants together (readers
//     behind a writer) are granted at the same moment on the server; their
//     Acquire calls may return in any order.
//
// How waiters wait. A waiter watches only nodes whose deletion can bring
// its grant, and only their deletions: a grant needs no action of anyone,
// so a waiter whose process stalls (frozen, cut off) holds up no one
// behind it once the rule grants it, and dlock never writes a lock node
// after creating it (read, create and delete are all the rights it needs;
// see "Security").
//
//   - A writer watches its immediate predecessor's deletion, as the mutex
//     does, with a data watch.
//   - A reader watches the nearest node ahead of it that is not a reader
//     (a writer, or a waiter of another Permits), with a data watch: it
//     holds once every node ahead is a reader, so while that node is there
//     it cannot. Every reader right behind a writer is granted when it
//     goes, so they all wake, but none in vain.
//   - A permit of a semaphore of N watches the deletion of each of the N
//     nodes nearest ahead of it (all of them, when fewer are ahead), and
//     of the nearest writer further ahead (its deletion may grant shared
//     nodes of another Permits ahead: a mismatch, reported then, though
//     not every such change wakes it, see above). While
//     those N nodes are there, at least N nodes are ahead of it, or the
//     same ones as when it looked: it cannot have been granted meanwhile,
//     whichever nodes further ahead have gone. So no wake-up is missed,
//     and each waiter is woken by the deletions themselves, not told down
//     the queue by the waiters ahead.
//
// A release thus wakes the writer behind the node, the readers right
// behind it, or at most N permit waiters (those that have it among their
// N nearest): a herd bounded by N, never by the queue's length. A join
// wakes no one. When holders release in random order, a release wakes
// about (N+1)/2 permit waiters, of which one is granted; the others look
// again and wait on. The watches of a permit waiter are child watches on
// the nodes (which fire on a deletion, not on a write of the data), and a
// Locker sets one per node, shared by all its waiters and kept while
// they wait again: the client library keeps a channel per watch set until
// the node changes, so a watch set at every look would pile channels up
// on a long-held permit. A permit waiter joining behind N nodes sends N
// such reads (in flight together), fewer where its Locker watches them
// already; looking again costs a request only for a node newly among its
// N nearest.
//
// So a release costs the releaser's delete and, on the server, the looks
// (a listing and a read each) of the waiters it wakes: TestSemaphoreDrain
// in the module's tests/zookeeper measures it with the server's own
// counters (mntr): one write per grant (its delete; the create is the
// join's), and four to five reads with a semaphore of 4. Every look lists
// the whole queue, whose size is that of a reply, not a number of
// requests. The waiter's keepalive while queued, its clean-up on
// cancellation or failure, and the loss watch of the granted lease are
// the mutex's.
//
// TryAcquire joins the queue for a moment: a writer's TryAcquire that
// finds readers or permits holding is a waiting exclusive node until it
// leaves (about a round trip), and a shared TryAcquire that lists the
// queue meanwhile finds a writer waiting ahead of it and fails with
// ErrNotAcquired, although only shared leases hold; so does a permit's
// TryAcquire queued behind a request of another Permits that is about to
// leave with its PermitsError. It is the mutex's TryAcquire against
// TryAcquire, whose nodes also stand before each other briefly. An
// Acquire is not affected (it waits for the node to go), and a TryAcquire
// tried again soon succeeds.
//
// # Fencing token
//
// Lease.Token is the czxid of our lock node: the zxid of the transaction
// that created it, so a later holder always has a larger token, across
// leader changes. It is never the 32-bit sequence suffix, which wraps
// (ZOOKEEPER-2944) and restarts when a reaped parent is created again.
//
// # Sessions, TTL and Refresh
//
// The lease lives in the driver's ZooKeeper session (one per Locker): if the
// process dies or is cut off, the server deletes its lock nodes when the
// session expires, a session timeout after it last heard from the client.
// The server negotiates that timeout within its bounds (by default 2 to 20
// ticks, 4s to 40s); [Driver.SessionTimeout] reports the value granted.
//
// The TTL of a lease is client-enforced within a bound set by that
// timeout, so that the lock means the same as on every dlock backend:
//
//   - A TTL may not exceed two thirds of the granted session timeout less
//     the servers' tickTime (Options.TickTime, URL parameter tick_time,
//     default 2s), which the Locker's Limits().MaxTTL reports; "How long
//     the session lives" below says why. A longer TTL fails with
//     ErrInvalidTTL before any I/O, and the Locker's default TTL is that
//     bound when it is below backend.DefaultTTL: on the default 40s session
//     and 2s tick, 40s - 40s/3 - 2s, about 24.67s. A session timeout too
//     short for the tick (a bound below backend.MinTTL) makes New or Open
//     fail with ErrInvalidConfig. The bound is read when the Locker is
//     made: a server whose maxSessionTimeout is lowered later needs new
//     Lockers.
//   - A lease not refreshed within its TTL is given up by the holder itself:
//     the driver deletes its node when the TTL runs out (a live client's
//     pings would otherwise keep it forever).
//   - Refresh writes nothing (no transaction: the zxid does not move). It
//     is described below; it restarts the TTL, which can be changed freely
//     within the bound, and reports the TTL asked.
//
// The lease is the session, so a refresh must prove two things as of a
// moment no earlier than its start: that the session was alive, and that
// our node was not deleted. A plain read (Exists or Get of the node) proves
// less than it seems: it is answered by the server we are connected to,
// which may be a follower behind the leader. A reply tells that the node
// existed in that server's state, and that this server had not closed our
// session (a server closes the connection of a session when it applies
// its expiry); it cannot tell that the leader has not already expired the
// session, or committed a deletion of the node, which the follower has yet
// to apply. On a follower cut off from the leader, such reads go on being
// answered (until the follower gives up on the leader, syncLimit ticks),
// while the leader may expire the session: a refresh by plain read could
// then extend a Deadline past the moment another holder is granted.
//
// So a refresh is a probe of the session: a sync request, which the
// follower passes through the leader and answers once it has applied
// everything the leader had ordered before it. It is not a transaction
// (nothing is logged, the zxid does not move). Its reply on the same
// connection proves that the session was alive when the leader ordered
// the sync, at or after the refresh began: had the session expired, its
// closing (and the deletion of its nodes) would come first, and the
// server would close the connection instead of replying. And ZooKeeper
// sends a watch event before the reply to any later request, so every
// deletion of our node committed before the sync has reached us as an
// event before the probe's reply, if the node's watch (set by the read
// that granted the lease) was in force on that connection before the
// probe was sent. The driver's one event loop marks a lease lost on that
// event; a lease not so marked when the probe returns is still ours.
// (Connected to the leader itself, the sync is answered at once, and the
// leader applies a commit, sending its events, only after sending it to
// the followers: a deletion of our node by another client allowed to
// delete it may reach us just after the reply: measured right after such
// deletes through a follower, 8 of 1,500 refreshes on the leader
// succeeded, none on a follower. The session's own end cannot: the leader
// marks a session closing before proposing its end, and refuses its sync
// from then on.)
//
// One probe serves every lease: refreshes that come while a probe is in
// flight share the next one, and [Driver.RefreshBatch] (the dlock layer's
// watchdog) refreshes any number of leases with one request. After a
// reconnect, watches set on the old connection are set again by the client
// library at a moment we cannot observe, so the first refresh of each lease
// on a new connection reads its node again (with a watch), after the probe
// on the same connection: one read each, in parallel, then none until the
// next reconnect. Refresh fails at once with ErrUnavailable while
// disconnected, or when the connection changed during the probe.
//
// # How long the session lives
//
// What the server does (ZooKeeper 3.8's source): only the leader expires
// sessions (SessionTrackerImpl). A "touch" of a session at leader time t
// puts it in the expiry bucket roundToNextInterval(t + timeout), the next
// multiple of tickTime strictly after t + timeout, and the expirer expires
// a bucket once its time has come: rounded up, never down, so a session
// lives at least its timeout after the leader's last touch of it. The
// leader touches a session when a client connected to the leader itself
// sends a request (ping included), when it creates the session, and when a
// client reconnecting through a follower has it revalidated (REVALIDATE).
// A request sent to a follower touches only the follower's table of
// touched sessions (LearnerSessionTracker); the follower passes that
// table on in its reply to the leader's next PING, which the leader sends
// to each follower every tickTime/2 (Leader.lead), and the leader touches
// each session listed when the reply arrives. Writes and syncs that a
// follower forwards to the leader do not touch the session there
// (LeaderZooKeeperServer.submitLearnerRequest goes straight to the
// PrepRequestProcessor, which only checks that the session is not
// closing).
//
// So a request's touch reaches the leader later than the request, which
// makes the session live longer, not shorter, as long as the follower
// passes it on. It may never do so: a follower cut off from the leader (or
// dying) just after answering a create or a sync, before its next PING
// reply. The leader then counts the timeout from the last touch the
// follower did pass on, which can be a tick (tickTime/2 for the PING plus
// its delivery) and the client's idle gap (go-zookeeper pings on a ticker
// every third of the session timeout, whatever else it sends) older than
// the request the Deadline is counted from. With a TTL up to the session
// timeout, a Deadline could then be later than the session's expiry by
// up to about a third of the timeout plus a tick.
//
// Hence the TTL bound: a TTL of at most timeout - timeout/3 - tickTime
// keeps every Deadline (the request's sending plus the TTL, less the
// drift margin) before the leader's expiry of the session, counted from
// the older touch. The driver does not know the servers' tickTime: it
// takes Options.TickTime (default 2s, ZooKeeper's default), so set it if
// yours differ; a value smaller than the servers' is unsafe. No test
// here reproduces the hazard itself: it needs a follower cut off from the
// leader in the window between answering a request and its next PING
// reply (under a tick), which a test cannot hit on purpose.
//
// # Failures
//
// Acquire and TryAcquire report an unreachable ensemble without a ctx
// deadline. A request cut by a broken connection, or one the client could
// not send, is tried again while the client reconnects. go-zookeeper fails
// the requests it has not sent (zk.ErrNoServer) each time it has gone
// through its server list, which after losing the only server is at once,
// before dialling anything: so that alone does not mean that no server
// answers. The call fails with ErrUnavailable once the connection has been
// down for a full reconnect cycle (a second per server, plus a second) and
// the client has dialled every server since, at its next round: within
// about two cycles. A leader election that ends within a cycle is ridden
// out (an Acquire started during it is served by the new leader); a
// longer one fails an Acquire not yet queued with ErrUnavailable. A frozen
// server that still accepts connections is slower to give up on:
// go-zookeeper waits up to 2/3 of the session timeout for an answer to a
// request, and ten times that for the answer to a connection's handshake,
// so pass a ctx deadline where that matters.
//
// A waiter already queued (its node created) keeps waiting while
// disconnected, whatever the client's rounds report (its node lives as
// long as its session), and gives up with ErrUnavailable once it has been
// without a connection for longer than the session timeout plus two
// seconds (a tick of a default server: the server expires sessions on tick
// boundaries, rounded up). By then its session may have expired, unless
// the whole ensemble is down, or a new leader was elected meanwhile (it
// gives every session a full timeout again): the waiter gives up its node
// all the same (deleted in the background) and with it its place in the
// queue, so the lock stays safe. A waiter whose session expires never gets
// the lock: it fails with ErrUnavailable, when it reconnects or once that
// time has passed, whichever comes first.
//
// Disconnected is "not certain": the session may survive (the client
// reconnects within the session timeout) or expire. While disconnected,
// Refresh fails at once with ErrUnavailable, so the lease ends at its
// Deadline unless the session comes back in time; the driver logs the
// state change (at Warn, to dlock.Options.Logger; the disconnection a
// Close causes only at Debug, and Close waits, up to a second, for the
// session's last events). Expired is lost: the session's event callback (one per
// Driver, no goroutine per lease) marks every lease lost on the session's
// expiry, and a lease lost when the server reports its node's deletion (by
// anyone but its own Release); one dispatcher goroutine per Driver then
// reports it to the dlock layer (backend.LossNotifier), which fires Done
// with ErrLeaseLost; Release then returns ErrNotHeld.
//
// # Holder, Inspect and watching a key
//
// The holder description of an acquire (dlock.AcquireOptions.Holder) is
// the data of its lock node, written by the create that makes the node, so
// the description exists exactly as long as the node: there is no moment
// at which a holder has none, it survives refreshes (which write nothing)
// and goes with the node on release or expiry. An acquire without one
// creates its node without data, the same request as before descriptions
// existed. Locker.Inspect lists the key's queue, reads the Stat of each
// holder's node (the node at its head; for shared leases, every node the
// grant rule grants, in parallel, oldest first in LockInfo.Holders; the
// czxid is the token) and, only for a node that holds data of at most
// backend.MaxHolderLen bytes, reads the data: one more round trip when
// there is a description. Shared and Permits come from the head node's
// name, and Waiters counts the other nodes. Data that is longer or is not a
// valid description (planted by a client allowed to write the node) is
// not shown. The description is stored in clear: any client the lock
// node's ACL lets read (every client, with the default ACL; see
// "Security") can read it.
//
// [Driver.WatchChanges] (backend.ChangeWatcher, which an election's
// followers use instead of polling Inspect) sets a child watch on the
// key's directory, and after each event sets it again by listing the
// directory anew before it signals, so no change after it returned goes
// unreported. A key nobody has locked yet has no directory (and the server
// reaps an idle one): the watch does not create it, as it only reads; it
// waits for its creation with an exists watch, then watches its children.
// The watch lives through lost connections as long as the session does
// (the client sets it again on reconnecting, and the server reports what
// changed meanwhile); it ends, closing its channel, when the session
// expires, the Locker is closed, or the session has been without a
// connection for longer than its timeout plus two seconds, when a queued
// waiter gives up too.
//
// # Keys
//
// Any key the root API accepts works: bytes outside [A-Za-z0-9_~.-] are
// percent-encoded, and "." and ".." are spelled %2E and %2E%2E, so every
// key is one valid path segment and distinct keys never share a queue.
//
// # Guarantees
//
// Fencing is consensus-grade; the lock works while a majority of the
// ensemble (counted from the server list given) is up; waiters are served
// FIFO; shared leases (semaphores, read-write locks) are served; safety
// does not rest on clocks beyond the local monotonic clock's rate, which
// Deadline needs on every backend.
//
// # Security
//
// ZooKeeper checks the right to create or delete a node on its parent: what
// keeps other clients from deleting a holder's lock node (and so taking
// its lock) is the ACL of the key directory, and what keeps them from
// creating, deleting idle key directories or taking the prefix over with
// SetACL (which fails every acquire) is the prefix's. The ACL of every
// node dlock creates (the prefix and its missing ancestors, key
// directories, lock nodes) is:
//
//   - Options.ACL (URL parameter acl) if set. To let several identities
//     share locks, list each with at least read, create and delete
//     (read: a waiter watches the nodes ahead of it; no write: dlock never
//     writes a lock node after creating it), and give every Locker the
//     same ACL; a digest id is "user:<base64 of SHA-1 of
//     user:password>", what zk.DigestACL computes. Entries are checked
//     before any I/O: a known scheme (world with id anyone, digest with
//     such an id, never a password, ip with an address or CIDR block,
//     auth with credentials, x509), permissions among cdrwa; errors name
//     the entry by index and scheme, never its text.
//   - Without it, with credentials (Options.Auth, user:password in the
//     URL): zk.AuthACL(zk.PermAll), every right to that identity and none
//     to anyone else. Lockers sharing the identity share the locks; a
//     client without it cannot read, create, delete or SetACL them
//     (zk.ErrNoAuth).
//   - Without either: zk.WorldACL(zk.PermAll), ZooKeeper's own default:
//     any client that reaches the ensemble can delete a lock node and take
//     the lock. Use it on trusted networks only.
//
// Under the prefix dlock keeps a persistent child, "!dlock" (no key's
// directory can have that name), created with the same ACL: key
// directories are container nodes the server removes once empty, and
// without it an idle prefix would be empty, so a client allowed to delete
// children of the prefix's parent (the root, world:anyone, for /dlock)
// could delete it and create it again with an ACL of its own, failing
// every acquire. ZooKeeper refuses to delete a node with children, and
// deleting the sentinel needs the delete right on the prefix. A prefix
// deleted all the same is created again by the next acquire, with that
// Locker's ACL: consistent only when every Locker has the same ACL (the
// same Options.ACL, or the same identity with the default); a prefix an
// administrator made with an ACL of its own must be made again by them.
//
// Open checks the rights it needs without changing anything it need not:
// it creates the prefix, its missing ancestors and the sentinel if
// missing, and reads the prefix's ACL. A server that refuses (zk.ErrNoAuth:
// the prefix is another identity's, or does not grant this one create and
// read; zk.ErrInvalidACL) fails Open with ErrInvalidConfig naming the
// prefix and the user (never the password). An Options.ACL in which no
// entry (world:anyone, auth, or the digest of Auth) gives this Locker read,
// create and delete is refused before any I/O, unless an ip or x509
// entry, or one of another provider's scheme (sasl), may. An identity with
// read only (for dlock inspect, say) cannot open a Locker: every Locker
// may acquire, and needs create and delete.
//
// Nodes that exist already keep their ACL: a prefix made before, by
// someone else or without credentials, may stay open to all. At open, a
// Locker with credentials or an ACL logs a warning (dlock.Options.Logger)
// if world:anyone may create, delete or change the prefix's ACL (then any
// client can delete the sentinel and the idle prefix), listing the ACL
// with digest hashes left out; fix it with setAcl
// or use another prefix. The prefix's own parent (the root, by default) is
// not dlock's. Without credentials or an ACL, a Locker warns once at open
// only if a server is off the loopback network: on a developer's local
// server that default is expected, and a warning on every open would be
// noise.
//
// Digest credentials travel in plaintext unless the connection uses TLS:
// the zks scheme (ZooKeeper's secureClientPort, served by its
// NettyServerCnxnFactory) with parameters ca, cert, key and server_name,
// or Options.TLS. Each server's certificate is verified for its host as
// given (zks://zk1.example.com:2281 checks zk1.example.com, whatever
// address it resolves to) unless server_name (tls.Config.ServerName)
// names one name for all. A failed handshake (an unknown CA, a name the
// certificate does not hold) is the last dial error a URL's Open reports
// when it gets no session within dial_timeout. A Locker logs a warning at
// open when it sends a password without TLS to a server off the loopback
// network, and when its TLS configuration skips verifying the servers
// (InsecureSkipVerify, Go only).
//
// # URL
//
//	zk://[user:password@]host1:2181,host2:2181[/prefix]?session_timeout=30s&ttl=15s
//	zks://user:password@host1:2281/locks?ca=ca.pem&acl=digest:alice:<digest>:cdrwa,digest:bob:<digest>:rcd
//
// The path is the prefix znode (default /dlock), created if missing: no
// empty, "." or ".." element, no NUL or other character ZooKeeper refuses,
// not under /zookeeper. Every server needs a host and a port from 1 to
// 65535 (default 2181). user:password turns on digest authentication: nodes
// are then created with an ACL for that identity only (see "Security").
// zks connects with TLS. Parameters: ttl
// (every backend), session_timeout (default 40s; from 1ms to 2^31-1 ms,
// what go-zookeeper can send), tick_time (the servers' tickTime, default
// 2s, from 1ms to 2^31-1 ms; see "How long the session lives") and
// dial_timeout (default 5s): the bound on Open's wait for a session; when it runs out the client
// is closed (no reconnect loop left) and the error carries the last dial
// error. acl: Options.ACL, entries scheme:id:perms separated by commas
// as zkCli writes them (perms among cdrwa; a '+' of a digest written
// %2B; ids holding a comma, such as x509 names, only through
// Options.ACL). For zks only: ca (a PEM file of the CAs to trust, default
// the system's), cert and key (a client certificate and its key, PEM
// files, both or neither), server_name (the name to verify, default each
// server's host as written in the URL, not the address it resolves to).
// Bad values and unknown parameters are errors wrapping
// [backend.ErrInvalidConfig], before any I/O.
//
// # Connection
//
// Unlike the other backends, New takes the server list rather than a live
// client: the driver needs its session's state changes and the negotiated
// session timeout, which go-zookeeper's Conn only offers to the code that
// connects. driver.LockerAs(locker, &conn), with conn a *zk.Conn (package
// github.com/dlock-go/dlock/driver), reaches the connection.
package zookeeper
