package servers

import (
	"context"
	"testing"
)

// StartPostgres starts a PostgreSQL server (version 15 by default) and waits
// until it accepts connections. Its superuser postgres needs no password;
// connect with [PostgresURL]. The caller owns the server and should
// Terminate it; [Main] removes it if left over. A server brought back by
// [Server.Start] after Stop or Kill comes back with its data (after crash
// recovery, for Kill).
func StartPostgres(ctx context.Context) (*Server, error) {
	srvs, err := startServers(ctx, "postgres", 1)
	if err != nil {
		return nil, err
	}
	return srvs[0], nil
}

// Postgres returns the test package's shared PostgreSQL server. It is
// started on first use and reused by every later call. Tests must not stop,
// kill or pause the shared server, and should use names (tables, lock keys)
// unique to the test; use [StartPostgres] for a server of one's own.
//
// If the server cannot be started, Postgres skips the test with the reason,
// or fails it when DLOCK_REQUIRE_SERVERS=1.
func Postgres(tb testing.TB) *Server {
	tb.Helper()
	srvs := shared(tb, "postgres", 1)
	if len(srvs) == 0 {
		return nil // tb was skipped or failed
	}
	return srvs[0]
}

// PostgresURL returns the connection URL of a server started by [Postgres]
// or [StartPostgres]: user postgres (no password), database postgres, no
// TLS, as in postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable.
// In bridge mode the port may change when the server is started again; call
// PostgresURL again after [Server.Start].
func PostgresURL(s *Server) string {
	return "postgres://postgres@" + s.Addr() + "/postgres?sslmode=disable"
}
