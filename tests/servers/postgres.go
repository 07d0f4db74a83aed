package servers

import (
	"context"
	"strconv"
)

// postgresDir is the directory, inside the container, that holds a server's
// data directory (postgresDir/data). It is not a volume, so it survives Stop
// and Kill (the container keeps its filesystem) and a restarted server comes
// back with its data.
const postgresDir = "/var/lib/dlock-postgres"

// postgresScript is the container's command, run by sh -c as root with the
// arguments $0 = postgresDir, $1 = the port and $2 = the address to listen
// on. On the first start it creates the database cluster with initdb (in a
// scratch directory renamed when complete, so a start interrupted during
// initdb starts over); then it runs the server in the foreground, as the
// postgres user. Both the official image and the Debian stand-in have the
// postgres user, setpriv (util-linux) and initdb and postgres on the PATH.
// The official image's entrypoint runs any command other than postgres
// unchanged, so its own initialisation (and its temporary server) never
// runs: the server's ready line is printed once per start.
//
// Clients authenticate as the superuser postgres without a password (trust,
// also over TCP); the locale is C and the encoding UTF8 in either image.
// fsync is off: a killed container loses nothing (the kernel keeps the
// writes), only a crash of the machine would.
const postgresScript = `set -e
if [ ! -d "$0/data" ]; then
	mkdir -p "$0"
	chown postgres:postgres "$0"
	rm -rf "$0/init"
	setpriv --reuid=postgres --regid=postgres --init-groups \
		initdb -D "$0/init" -A trust -U postgres -E UTF8 --locale=C --no-sync
	mv "$0/init" "$0/data"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
	postgres -D "$0/data" -p "$1" -c listen_addresses="$2" -k /tmp \
	-c fsync=off -c max_connections=200`

// postgresKind: a PostgreSQL server (a group of one).
//
// In host mode it listens on 127.0.0.1 with a port chosen up front; in
// bridge mode on every address at 5432, published on a random host port.
var postgresKind = &kind{
	name:         "postgres",
	imageEnv:     "DLOCK_POSTGRES_IMAGE",
	defaultImage: "postgres:15",
	ports:        []int{5432},
	cmd: func(p *plan, i int) []string {
		m := p.members[i]
		return []string{"sh", "-c", postgresScript, postgresDir, strconv.Itoa(m.ports[0]), m.bind}
	},
	// Printed by the postmaster when it accepts connections: once per
	// start (after crash recovery, if any), and again only if it has to
	// reinitialise after a backend crashed.
	readyLog: literal("database system is ready to accept connections"),
	// PostgreSQL's fast shutdown (the official image's STOPSIGNAL):
	// SIGTERM asks for a smart shutdown, which waits for every client to
	// disconnect.
	stopSignal: "SIGINT",
}

// StartPostgres starts a PostgreSQL server (version 15 by default) and waits
// until it accepts connections. Its superuser postgres needs no password;
// connect with [PostgresURL]. The caller owns the server and should
// Terminate it; [Main] removes it if left over. A server brought back by
// [Server.Start] after Stop or Kill comes back with its data (after crash
// recovery, for Kill).
func StartPostgres(ctx context.Context) (*Server, error) {
	srvs, err := start(ctx, postgresKind, 1)
	if err != nil {
		return nil, err
	}
	return srvs[0], nil
}
