// Package servers starts real servers in containers for dlock's tests, using
// testcontainers-go (through serverd, see below), and gives tests fault
// controls over them (stop, start, kill, pause; a Redis server's wall clock
// jump), and a TCP proxy that cuts or slows a client's link to them.
//
// Only test files import this package; the library itself never does. It
// uses only the standard library, so importing it adds nothing to a
// module's go.mod.
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
//	DLOCK_SERVERD           the serverd binary to run (see below); unset,
//	                        it is built from source.
//
// testcontainers-go's own variables apply too, notably DOCKER_HOST and
// TESTCONTAINERS_RYUK_DISABLED (set it to "true" where the Ryuk reaper image
// cannot be pulled; serverd removes containers itself either way).
//
// Every server runs with an explicit command line (e.g. redis-server --port N
// ...; a ZooKeeper server's is a short sh -c script that writes its zoo.cfg
// and runs zkServer.sh start-foreground on it; a PostgreSQL server's is one
// that runs initdb on the first start and then postgres, as the postgres
// user), so an image works whether it has an entrypoint (official images) or
// none at all (stand-in images made with docker import, as scripts/test.sh
// builds them on machines that cannot pull: Redis (with libfaketime),
// ZooKeeper and PostgreSQL from Debian packages with debootstrap, etcd from
// the Go module in the etcdserver directory).
// Readiness is detected from the server's log, which works in both network
// modes.
//
// Server addresses are always loopback (127.0.0.1:port).
//
// # How the servers reach Docker
//
// This package does not talk to Docker itself. All the container code
// (testcontainers-go, the Docker client, the kinds of server, their command
// lines and readiness checks) is in the command serverd (tests/serverd, in
// the development module, tests), so that testcontainers-go's many
// dependencies stay out of every library module's go.mod and go.sum, and
// out of their users'. The first call that needs a server starts one
// serverd child process per test process; each operation (start servers,
// Stop, Kill, ShiftClock, Terminate, ...) is one JSON request on the
// child's standard input, answered on its standard output, matched by a
// request id, so that parallel tests' requests run concurrently. A
// request's context deadline goes with it, and a request whose context
// ends is cancelled in serverd (servers it had started by then are
// terminated, not left running until the process ends). If serverd dies,
// every call fails at once with an error that gives its exit status.
// Errors keep what tests look at: their message, matching [ErrNoFaketime]
// or [ErrNeedsHostNetwork], and whether something (Docker, an image) is
// missing, on which tests skip unless DLOCK_REQUIRE_SERVERS=1.
//
// [Main] asks serverd to remove everything and waits for it to exit. A test
// process that dies without Main (a crash, a timeout panic, SIGKILL) closes
// serverd's standard input by dying, and serverd then removes every
// container and network it started and exits: nothing is left running.
//
// The serverd binary is $DLOCK_SERVERD if set (scripts/test.sh builds it
// once per run, into its cache directory, and exports it); otherwise this
// package builds it with `go build` from tests/serverd in the checkout it
// was compiled from (found with runtime.Caller), once per test process, and
// deletes the binary once started. That needs the go command and the
// source, as in this repository; a test binary built with -trimpath needs
// DLOCK_SERVERD.
package servers
