// Package servers starts real servers in containers for dlock's tests, with
// testcontainers-go, and gives tests fault controls over them (stop, start,
// kill, pause; a Redis server's wall clock jump), and a TCP proxy that cuts
// or slows a client's link to them.
//
// It lives in the development module (tests), which users never import:
// testcontainers-go and its many dependencies stay out of the library's
// go.mod and go.sum, and out of their users'. So every test that needs a
// server lives in this module too (tests/redis, tests/etcd, tests/matrix,
// ...); a backend reaches its internals there through internal/testhook,
// and its examples get their servers from tests/examples.
//
// A test package shares one set of servers: call [Redis], [Etcd],
// [ZooKeeper] or [Postgres] from any test to get the package's servers
// (started on first use, reused afterwards) and install [Main] as the
// package's TestMain so the containers are removed at the end:
//
//	func TestMain(m *testing.M) { servers.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		srv := servers.Redis(t, 1)[0]
//		client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
//		...
//	}
//
//	func TestEtcdThing(t *testing.T) {
//		cluster := servers.Etcd(t, 3) // a shared 3-member cluster
//		client, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
//		...
//	}
//
//	func TestZooKeeperThing(t *testing.T) {
//		ensemble := servers.ZooKeeper(t, 1) // a shared standalone server
//		conn, _, err := zk.Connect(ensemble.Servers(), 4*time.Second)
//		...
//	}
//
//	func TestPostgresThing(t *testing.T) {
//		srv := servers.Postgres(t) // the shared server
//		pool, err := pgxpool.New(t.Context(), servers.PostgresURL(srv))
//		...
//	}
//
// Keys must be unique per test so that tests can run in parallel on the
// shared servers. A test that changes a server's state (Stop, Kill, Pause)
// should start its own servers with [StartRedis], [StartEtcd],
// [StartZooKeeper] or [StartPostgres] instead, and Terminate them.
// [StartEtcdTLS], [StartRedisTLS] and [StartZooKeeperTLS] start servers
// that serve clients over TLS only, under a certificate from a CA made for
// them (returned as PEM, for the clients to trust); [StartRedisCluster] a cluster-mode Redis owning every hash
// slot; [StartRedisSentinel] a Redis primary, replica and Sentinel;
// [StartRedisWithArgs] Redis servers with extra arguments (persistence);
// [StartRedisFaketime] Redis servers under libfaketime, whose wall clock
// [Server.ShiftClock] moves (keys then expire early or late; the image
// needs Debian's libfaketime, which the stand-in built by scripts/test.sh
// has, else the error matches [ErrNoFaketime]).
//
// A [Proxy] (see [NewProxy]) sits between a client and a server on
// loopback: [Proxy.Blackhole] partitions them (nothing passes; what was
// sent is delivered in order on [Proxy.Heal], as TCP retransmits across a
// healed partition), [Proxy.Delay] adds latency each way. Close it when
// done; it needs no container, so it works in front of any address.
//
// Redis servers are independent of each other. Each member of an etcd
// cluster is a [Server] too, so the same fault controls apply to it; a member
// that is stopped or killed keeps its data and rejoins on Start. Members of one
// cluster are started together, each told the others' peer addresses up
// front. The same holds for the servers of a ZooKeeper ensemble
// ([StartZooKeeper] with n = 3; n = 1 is a standalone server), which tick
// every 200ms and accept session timeouts from 400ms to 2 minutes. A
// PostgreSQL server keeps its data across Stop and Kill too; its superuser
// postgres needs no password ([PostgresURL] is the connection URL), and Stop
// is PostgreSQL's fast shutdown.
//
// # Configuration
//
// The environment selects images and networking; the defaults suit a
// developer machine whose Docker engine can pull official images:
//
//	DLOCK_REDIS_IMAGE       Redis image (default "redis:7.2").
//	DLOCK_ETCD_IMAGE        etcd image (default
//	                        "quay.io/coreos/etcd:v3.7.3"); it must have the
//	                        server at /usr/local/bin/etcd, as the official
//	                        image does.
//	DLOCK_ZOOKEEPER_IMAGE   ZooKeeper image (default "zookeeper:3.8"); it
//	                        must have zkServer.sh on its PATH and log to
//	                        stdout or stderr, as the official image does.
//	DLOCK_POSTGRES_IMAGE    PostgreSQL image (default "postgres:15"); it
//	                        must have the postgres user, setpriv, and initdb
//	                        and postgres on its PATH, as the official image
//	                        does.
//	DLOCK_TEST_NETWORK      "bridge" (default): the container's port is
//	                        published on a random host port.
//	                        An etcd cluster or ZooKeeper ensemble gets a
//	                        network of its own, on which members reach each
//	                        other by name.
//	                        "host": host networking; each server listens on
//	                        free 127.0.0.1 ports chosen by this package.
//	                        Use it with stand-in images and on engines
//	                        without working port publishing.
//	DLOCK_REQUIRE_SERVERS   "1": a test that cannot get its servers fails
//	                        instead of being skipped. scripts/test.sh (and
//	                        so CI) sets it.
//	DLOCK_TEST_RUN          optional label value (dlock.test.run) put on
//	                        every container and network, so a wrapper
//	                        script can remove leftovers of a crashed run.
//
// testcontainers-go's own variables apply too, notably DOCKER_HOST and
// TESTCONTAINERS_RYUK_DISABLED (set it to "true" where the Ryuk reaper image
// cannot be pulled; this package removes its containers itself either way,
// see below).
//
// Every server runs with an explicit command line (e.g. redis-server --port N
// ...; a ZooKeeper server's is a short sh -c script that writes its zoo.cfg
// and runs zkServer.sh start-foreground on it; a PostgreSQL server's is one
// that runs initdb on the first start and then postgres, as the postgres
// user), so an image works whether it has an entrypoint (official images) or
// none at all (stand-in images made with docker import, as scripts/test.sh
// builds them on machines that cannot pull: Redis (with libfaketime),
// ZooKeeper and PostgreSQL from Debian packages with debootstrap, etcd from
// the development module's tests/etcdserver).
// Readiness is detected from the server's log, which works in both network
// modes.
//
// Server addresses are always loopback (127.0.0.1:port).
//
// # Clean-up
//
// [Main] terminates every server and removes every network the test
// process started. A test process that dies without Main (a crash, a
// timeout panic, SIGKILL) leaves nothing running either: before its first
// container, the process starts a reaper, a shell child reading a pipe
// from it; when the process ends the pipe closes, and the reaper removes
// every container and network labelled as the process's (label
// dlock.test.owner: its pid and a random token), with the docker command. Errors keep what tests look
// at: matching [ErrNoFaketime] or [ErrNeedsHostNetwork], and whether
// something (Docker, an image) is missing, on which tests skip unless
// DLOCK_REQUIRE_SERVERS=1.
package servers
