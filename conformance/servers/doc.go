// Package servers starts real servers in containers for dlock's tests, using
// testcontainers-go, and gives tests fault controls over them (stop, start,
// kill, pause).
//
// Only test files import this package; the library itself never does.
//
// A test package shares one set of servers: call [Redis] from any test to get
// the package's servers (started on first use, reused afterwards) and install
// [Main] as the package's TestMain so the containers are removed at the end:
//
//	func TestMain(m *testing.M) { servers.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		srv := servers.Redis(t, 1)[0]
//		client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
//		...
//	}
//
// Keys must be unique per test so that tests can run in parallel on the
// shared servers. A test that changes a server's state (Stop, Kill, Pause)
// should start its own servers with [StartRedis] instead, and Terminate them.
//
// # Configuration
//
// The environment selects images and networking; the defaults suit a
// developer machine whose Docker engine can pull official images:
//
//	DLOCK_REDIS_IMAGE       Redis image (default "redis:7.2").
//	DLOCK_TEST_NETWORK      "bridge" (default): the container's port is
//	                        published on a random host port.
//	                        "host": host networking; each server listens on
//	                        a free 127.0.0.1 port chosen by this package.
//	                        Use it with stand-in images and on engines
//	                        without working port publishing.
//	DLOCK_REQUIRE_SERVERS   "1": a test that cannot get its servers fails
//	                        instead of being skipped. scripts/test.sh (and
//	                        so CI) sets it.
//	DLOCK_TEST_RUN          optional label value (dlock.test.run) put on
//	                        every container, so a wrapper script can remove
//	                        leftovers of a crashed run.
//
// testcontainers-go's own variables apply too, notably DOCKER_HOST and
// TESTCONTAINERS_RYUK_DISABLED (set it to "true" where the Ryuk reaper image
// cannot be pulled; [Main] removes containers itself either way).
//
// Every server runs with an explicit command line (e.g. redis-server --port N
// ...), so an image works whether it has an entrypoint (official images) or
// none at all (stand-in images made with debootstrap and docker import, as
// scripts/test.sh builds them on machines that cannot pull). Readiness is
// detected from the server's log, which works in both network modes.
//
// Server addresses are always loopback (127.0.0.1:port).
package servers
