package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func init() {
	register(&command{name: "serve", short: "start a single-member etcd for local development", run: serve})
}

// serveDefaultListen is the client address of dlock serve: etcd's own
// default, on the loopback interface.
const serveDefaultListen = "127.0.0.1:2379"

// serveReadyTimeout bounds the wait for the embedded etcd to be ready
// (replaying a large data directory may take a while).
const serveReadyTimeout = 60 * time.Second

// serveNoOrigin is the one entry of the embedded etcd's CORS list: not an
// origin, so that no Origin header matches it (an empty list would allow
// them all).
const serveNoOrigin = "none: dlock serve allows no cross-origin request"

// serveLogName is the file, in the data directory, that etcd's own log
// goes to.
const serveLogName = "etcd.log"

const serveUsage = `usage: dlock serve [--data DIR] [--listen 127.0.0.1:2379]

Serve starts a single-member etcd server in this process, for local
development: a correctness-grade dlock backend (consensus fencing) with
no Docker and no other install. Once it is ready it prints the URL to
give dlock (etcd://127.0.0.1:2379) and an export line for $DLOCK_URL;
it runs until interrupted (SIGINT or SIGTERM), then stops cleanly and
exits with status 0.

The data (etcd's member directory) is kept in DIR, so the locks and the
fencing tokens survive a restart: a restarted server goes on with larger
tokens. The default DIR is dlock/serve in the user's cache directory
(os.UserCacheDir: $XDG_CACHE_HOME or ~/.cache on Linux, ~/Library/Caches
on macOS), or ./dlock-serve-data where there is none. etcd's own log goes
to DIR/etcd.log (warnings and errors only).

The server listens for clients on the --listen address, which must be on
the loopback interface (127.0.0.1, ::1 or localhost): it has no TLS and
no authentication. The peer port (which a single member does not use,
but etcd needs) is a free loopback port chosen at each start.

It serves etcd's gRPC API (what dlock, etcdctl and etcd's Go client use),
and over HTTP only /health, /version and the like, not etcd's HTTP/JSON
gateway (/v3/kv/...), so that no web page can change a key: an HTTP
request whose Host header is not a loopback name (localhost, 127.0.0.1,
::1, or the --listen host) is refused with status 421 (a page that
rebinds a name of its own to 127.0.0.1 sends that name), and no response
allows a cross-origin read (no CORS).

Flags:
`

func serve(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet("serve", serveUsage)
	data := fs.String("data", "", "keep etcd's data in `DIR` (default: dlock/serve in the user's cache directory)")
	listen := fs.String("listen", serveDefaultListen, "serve clients on this loopback `address`")
	if status, ok := parseFlags(e, "serve", fs, args); !ok {
		return status
	}
	if fs.NArg() > 0 {
		return usageFail(e, "serve", "unexpected argument %q", fs.Arg(0))
	}
	host, port, err := loopbackAddr(*listen)
	if err != nil {
		fmt.Fprintf(e.stderr, "dlock serve: --listen %s: %v\nRun 'dlock serve -h' for usage.\n", *listen, err)
		return exitUsage
	}
	dir := *data
	if dir == "" {
		dir = defaultServeDir()
	}
	if dir, err = filepath.Abs(dir); err == nil {
		err = os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "dlock serve: data directory: %v\n", err)
		return exitFailure
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runEtcd(ctx, e.stdout, dir, host, port); err != nil {
		fmt.Fprintf(e.stderr, "dlock serve: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// loopbackAddr splits a --listen address and checks that its host is a
// loopback address (localhost is 127.0.0.1) and its port a number.
func loopbackAddr(addr string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", err
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", "", fmt.Errorf("want a port from 1 to 65535")
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return "", "", fmt.Errorf("not a loopback address (the server has no TLS and no authentication)")
	}
	return host, port, nil
}

// defaultServeDir is the data directory when --data is not given.
func defaultServeDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "dlock", "serve")
	}
	return "dlock-serve-data"
}

// runEtcd runs a single-member etcd with its data in dir, serving clients
// on host:port, until ctx ends; it prints the URL to stdout once the
// server is ready.
func runEtcd(ctx context.Context, stdout io.Writer, dir, host, port string) error {
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort(host, port)}
	// Port 0: the peer listener gets a free port from the kernel (no
	// other member ever dials it; the URL etcd records is the same at
	// every start).
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort(host, "0")}

	cfg := embed.NewConfig()
	cfg.Name = "dlock-serve"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// No web page may use the server (issue 21): a page a browser shows
	// can send it requests, directly or by DNS rebinding.
	//   - No cross-origin reads: an empty CORS map means "any origin" to
	//     etcd, so it holds one entry no Origin header can equal.
	//   - Only loopback Host headers (without the port; etcd's default
	//     "*" allows any): a rebound name of the page's own is refused
	//     with 421. This is about HTTP/1 only: gRPC (HTTP/2) goes straight
	//     to the gRPC server, which dlock and etcdctl use.
	//   - No HTTP/JSON gateway (/v3/kv/...): a "simple" cross-origin POST
	//     (Content-Type text/plain, no preflight) from a page to
	//     127.0.0.1 passes both checks above, and the gateway would carry
	//     it out even though the page cannot read the answer.
	cfg.CORS = map[string]struct{}{serveNoOrigin: {}}
	cfg.HostWhitelist = map[string]struct{}{"localhost": {}, "127.0.0.1": {}, "::1": {}, "[::1]": {}, host: {}}
	cfg.EnableGRPCGateway = false
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{filepath.Join(dir, serveLogName)}

	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("starting etcd: %w (log: %s)", err, filepath.Join(dir, serveLogName))
	}
	defer srv.Close()

	timer := time.NewTimer(serveReadyTimeout)
	defer timer.Stop()
	select {
	case <-srv.Server.ReadyNotify():
	case err := <-srv.Err():
		return fmt.Errorf("etcd: %w", err)
	case <-timer.C:
		return fmt.Errorf("etcd not ready after %v (log: %s)", serveReadyTimeout, filepath.Join(dir, serveLogName))
	case <-ctx.Done():
		return nil
	}

	dlockURL := "etcd://" + clientURL.Host
	fmt.Fprintf(stdout, "%s\n", dlockURL)
	fmt.Fprintf(stdout, "# a single-member etcd, data in %s; stop it with ^C\n", dir)
	fmt.Fprintf(stdout, "export DLOCK_URL=%s\n", dlockURL)

	select {
	case <-ctx.Done():
		return nil
	case err := <-srv.Err():
		return fmt.Errorf("etcd: %w", err)
	case <-srv.Server.StopNotify():
		return errors.New("etcd stopped")
	}
}
