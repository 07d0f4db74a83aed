#!/usr/bin/env bash
# scripts/test.sh — the one test command for dlock (`make test` runs it).
#
# It makes real servers available and then runs `go test -race -count=1`
# (and, on a run of every package, the ZooKeeper explorer and tests/zookeeper
# a second time without -race: see step 6):
#
#   1. installs missing Debian packages when running as root (docker.io,
#      and debootstrap only when a Debian-based stand-in image must be built);
#   2. starts a Docker engine (dockerd --iptables=false) if none answers;
#      the engine is left running for later runs;
#   3. for every server image the tests use (DLOCK_REDIS_IMAGE, default
#      redis:7.2; DLOCK_ETCD_IMAGE, default quay.io/coreos/etcd:v3.7.3;
#      DLOCK_ZOOKEEPER_IMAGE, default zookeeper:3.8; DLOCK_POSTGRES_IMAGE,
#      default postgres:15): uses it if present, else tries `docker pull`,
#      else builds a stand-in image and tags it with the configured name.
#      The Redis, ZooKeeper and PostgreSQL stand-ins are made from Debian
#      packages (debootstrap + docker import; Redis from trixie, 8.0, as
#      some tests need 7.2 or later, with libfaketime, which
#      tests/servers' StartRedisFaketime needs for server clock jumps;
#      the ZooKeeper one has Debian's
#      /usr/share/zookeeper/bin, where zkServer.sh is, on its PATH and logs
#      to the console, as the official image does; the PostgreSQL one has
#      /usr/lib/postgresql/15/bin, where initdb and postgres are, on its
#      PATH, as the official image does); the etcd
#      stand-in holds only an etcd binary built from its Go module
#      (tests/etcdserver: go build + docker import);
#   4. when a stand-in is in use, selects host networking and disables Ryuk
#      (DLOCK_TEST_NETWORK=host, TESTCONTAINERS_RYUK_DISABLED=true) unless the
#      caller already chose;
#   5. exports DLOCK_REQUIRE_SERVERS=1 so no server test skips silently;
#   6. on a run of every package (no package named), runs the explorer
#      (tests/matrix TestExplore) on ZooKeeper once more in a build without
#      -race: only there does it draw connection resets, server kills and
#      Close during an operation on ZooKeeper, as the go-zookeeper client
#      has data races of its own on those paths (see tests/matrix
#      explorer.resets). For the same reason it runs tests/zookeeper once
#      more without -race: its tests that reconnect a client with watches
#      set skip themselves under -race (see reconnects there).
#      DLOCK_TEST_RACE=off drops -race from any run (make explore/soak
#      RACE=off).
#
# Usage:
#   scripts/test.sh                      # go test -race -count=1 over every module of go.work
#   scripts/test.sh -run X ./tests/redis/ # extra go test args pass through
#   scripts/test.sh --setup-only         # steps 1-5 only; prints the env to export
#
# Knobs (environment): DLOCK_REDIS_IMAGE, DLOCK_ETCD_IMAGE,
# DLOCK_ZOOKEEPER_IMAGE, DLOCK_POSTGRES_IMAGE, DLOCK_TEST_NETWORK,
# DLOCK_REQUIRE_SERVERS,
# TESTCONTAINERS_RYUK_DISABLED,
# DLOCK_CACHE_DIR (cache of stand-in root filesystems and etcd binaries;
# default /var/cache/dlock as root, else ~/.cache/dlock),
# DLOCK_DEBIAN_MIRROR (default: read from the apt sources),
# DLOCK_DEBIAN_SUITE (default: trixie for Redis, else this host's codename,
# else bookworm),
# DLOCK_TEST_RACE (off: no -race),
# DLOCK_DOCKERD_LOG (default /tmp/dlock-dockerd.log), DLOCK_TEST_LOG (the
# verbose go test log; default a new file per run,
# $TMPDIR/dlock-test-DATE-TIME-XXXXXX.log, its path printed), DLOCK_PULL_TIMEOUT
# (seconds, default 60).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*" >&2; }
note() { printf '    %s\n' "$*" >&2; }
die() { printf '\nscripts/test.sh: error: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

setup_only=false
if [ "${1:-}" = "--setup-only" ]; then
	setup_only=true
	shift
fi

# ---------------------------------------------------------------------------
# Debian packages

apt_updated=false
apt_install() { # apt_install PKG... : install the packages, as root, via apt.
	is_root || die "need Debian package(s) $* but not running as root; install them first"
	command -v apt-get >/dev/null || die "need $* but apt-get is not available; install them first"
	if ! $apt_updated; then
		note "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		apt_updated=true
	fi
	note "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

step "Checking tools"
command -v go >/dev/null || die "the go command is not on PATH"
need=()
command -v docker >/dev/null || need+=(docker.io)
if ! command -v gcc >/dev/null; then # go test -race needs cgo
	need+=(gcc libc6-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
	apt_install "${need[@]}"
fi
note "go: $(go version)"
note "docker: $(docker --version)"

# ---------------------------------------------------------------------------
# Docker engine

step "Checking the Docker engine"
if docker info >/dev/null 2>&1; then
	note "a Docker engine is reachable"
else
	command -v dockerd >/dev/null || apt_install docker.io
	is_root || die "no Docker engine is reachable and starting one (dockerd) needs root"
	log=${DLOCK_DOCKERD_LOG:-/tmp/dlock-dockerd.log}
	note "starting dockerd --iptables=false (log: $log)"
	# setsid + nohup: the engine outlives this script so later runs reuse it.
	setsid nohup dockerd --iptables=false >"$log" 2>&1 </dev/null &
	dockerd_pid=$!
	echo "$dockerd_pid" >/tmp/dlock-dockerd.pid
	ok=false
	for _ in $(seq 1 60); do
		if docker info >/dev/null 2>&1; then
			ok=true
			break
		fi
		kill -0 "$dockerd_pid" 2>/dev/null || break
		sleep 1
	done
	if ! $ok; then
		tail -n 30 "$log" >&2 || true
		die "dockerd did not become ready within 60s (log: $log)"
	fi
	note "dockerd is ready (pid $dockerd_pid, log $log); it is left running"
fi

# ---------------------------------------------------------------------------
# Server images

standin_label=org.dlock.standin
if is_root; then
	cache_dir=${DLOCK_CACHE_DIR:-/var/cache/dlock}
else
	cache_dir=${DLOCK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dlock}
fi

host_codename() {
	local c=""
	if [ -r /etc/os-release ]; then
		c=$(. /etc/os-release && [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}") || true
	fi
	echo "${c:-bookworm}"
}

# debian_mirror prints the Debian archive URL apt on this host uses for the
# main suite (deb822 .sources files first, then one-line sources.list).
debian_mirror() {
	if [ -n "${DLOCK_DEBIAN_MIRROR:-}" ]; then
		echo "$DLOCK_DEBIAN_MIRROR"
		return
	fi
	local f url
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		url=$(awk '
			BEGIN { RS = ""; FS = "\n" }   # paragraphs
			{
				uris = ""; suites = ""; types = ""
				for (i = 1; i <= NF; i++) {
					if ($i ~ /^URIs:/)   { uris = $i;   sub(/^URIs:[ \t]*/, "", uris) }
					if ($i ~ /^Suites:/) { suites = $i; sub(/^Suites:[ \t]*/, "", suites) }
					if ($i ~ /^Types:/)  { types = $i }
				}
				if (types ~ /deb( |$)/ && uris != "" && suites !~ /-security/) {
					split(uris, u, /[ \t]+/); print u[1]; exit
				}
			}' "$f")
		if [ -n "$url" ]; then
			echo "$url"
			return
		fi
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -r "$f" ] || continue
		url=$(awk '$1 == "deb" && $0 !~ /security/ {
			for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; exit }
		}' "$f")
		if [ -n "$url" ]; then
			echo "$url"
			return
		fi
	done
	return 1
}

# import_standin TARBALL IMAGE WHAT [PATHDIR]: docker import a root
# filesystem as a stand-in image; WHAT (no spaces) goes into its
# $standin_label label; PATHDIR, if given, is appended to the image's PATH.
import_standin() {
	local path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	if [ -n "${4:-}" ]; then
		path=$path:$4
	fi
	docker import \
		--change "LABEL $standin_label=$3" \
		--change "ENV PATH=$path" \
		"$1" "$2" >/dev/null
}

# build_debian_standin IMAGE PACKAGES [PATHDIR [FIXUP]]: build IMAGE from
# Debian packages (PACKAGES comma-separated; their dependencies come along),
# with PATHDIR added to its PATH. FIXUP, if given, is a function run as
# FIXUP ROOTFS after debootstrap to adjust the root filesystem. The tarball
# of the root filesystem is cached in $cache_dir (its name has a hash of
# FIXUP's code, so changing FIXUP makes a new one), and only the first build
# pays for debootstrap.
build_debian_standin() {
	local image=$1 packages=$2 pathdir=${3:-} fixup=${4:-}
	local suite
	suite=$(standin_debian_suite)
	local name="rootfs-$suite-${packages//,/-}"
	if [ -n "$fixup" ]; then
		name="$name-$fixup-$(declare -f "$fixup" | sha256sum | cut -c1-8)"
	fi
	local tarball="$cache_dir/$name.tar"
	if [ -s "$tarball" ]; then
		note "reusing cached root filesystem $tarball"
	else
		is_root || die "image $image is missing and building a stand-in (debootstrap) needs root"
		command -v debootstrap >/dev/null || apt_install debootstrap
		local mirror
		mirror=$(debian_mirror) || die "cannot find a Debian mirror in the apt sources; set DLOCK_DEBIAN_MIRROR"
		mkdir -p "$cache_dir"
		local rootfs="$cache_dir/rootfs-$suite-$$"
		rm -rf "$rootfs"
		note "debootstrap --variant=minbase --include=$packages $suite (takes a minute or two)"
		local start=$SECONDS
		if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" \
			>"$cache_dir/debootstrap.log" 2>&1; then
			tail -n 30 "$cache_dir/debootstrap.log" >&2 || true
			rm -rf "$rootfs"
			die "debootstrap failed (log: $cache_dir/debootstrap.log)"
		fi
		rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* || true
		if [ -n "$fixup" ] && ! "$fixup" "$rootfs"; then
			rm -rf "$rootfs"
			die "$fixup failed"
		fi
		tar -C "$rootfs" -cf "$tarball.tmp.$$" .
		mv "$tarball.tmp.$$" "$tarball"
		rm -rf "$rootfs"
		note "built $tarball in $((SECONDS - start))s"
	fi
	import_standin "$tarball" "$image" "debian-$suite:$packages" "$pathdir"
	note "imported stand-in image $image (Debian $suite: $packages)"
}

# zookeeper_fixup ROOTFS: make Debian's zkServer.sh log to the console, as
# the official image's does. Debian's zookeeper 3.8 puts no SLF4J binding on
# the server's class path, so the server would log nothing at all (and
# tests/servers waits for log lines): add log4j's binding, and select
# the console appender of Debian's log4j.properties. zkServer.sh sources
# this environment file (as zkEnv.sh) on every start.
zookeeper_fixup() {
	local root=$1 jar
	local env=$root/etc/zookeeper/conf_example/environment
	if [ ! -f "$env" ]; then
		note "$env is missing"
		return 1
	fi
	for jar in slf4j-log4j12.jar log4j-1.2.jar; do
		if [ ! -e "$root/usr/share/java/$jar" ]; then
			note "/usr/share/java/$jar is missing"
			return 1
		fi
	done
	cat >>"$env" <<'EOF'

# Added by dlock's scripts/test.sh: log to the console (docker logs).
CLASSPATH="$CLASSPATH:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"
JVMFLAGS="-Dzookeeper.root.logger=INFO,CONSOLE $JVMFLAGS"
EOF
}

# build_etcd_standin IMAGE: build IMAGE holding only /usr/local/bin/etcd (where
# the official image keeps it), built from the Go module
# tests/etcdserver at the etcd version the development module (tests)
# requires.
# The static binary is cached in $cache_dir by version.
build_etcd_standin() {
	local image=$1
	local mod=tests/etcdserver
	local version
	version=$(sed -n 's|.*go\.etcd\.io/etcd/server/v3 \(v[^ ]*\).*|\1|p' tests/go.mod | head -n 1)
	[ -n "$version" ] || die "cannot read the etcd server version from tests/go.mod"
	local bin="$cache_dir/etcd-$version"
	if [ -x "$bin" ]; then
		note "reusing cached etcd binary $bin"
	else
		mkdir -p "$cache_dir"
		note "go build etcd $version from $mod (about a minute the first time)"
		local start=$SECONDS
		(cd "$mod" && GOWORK=off CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$bin.tmp.$$" .) ||
			die "building etcd from $mod failed"
		mv "$bin.tmp.$$" "$bin"
		note "built $bin in $((SECONDS - start))s"
	fi
	local root
	root=$(mktemp -d)
	install -d -m 0755 "$root/usr" "$root/usr/local" "$root/usr/local/bin" "$root/var" "$root/var/lib" "$root/var/lib/etcd"
	install -d -m 1777 "$root/tmp"
	install -m 0755 "$bin" "$root/usr/local/bin/etcd"
	tar -C "$root" --numeric-owner --owner=0 --group=0 -cf "$root.tar" .
	import_standin "$root.tar" "$image" "go.etcd.io/etcd/server/v3@$version"
	rm -rf "$root" "$root.tar"
	note "imported stand-in image $image (etcd $version built from its Go module)"
}

standin_used=false

# standin_debian_suite: the Debian release a stand-in is built from
# (DLOCK_DEBIAN_SUITE, else the caller's standin_suite, else this host's).
standin_debian_suite() { echo "${DLOCK_DEBIAN_SUITE:-${standin_suite:-$(host_codename)}}"; }

# ensure_image IMAGE BUILD [ARG...]: make IMAGE available locally; if it is
# neither present nor pullable, run BUILD IMAGE ARG... to build a stand-in.
# A Debian stand-in built from another release or other packages than
# asked now (an older script's) is built again.
ensure_image() {
	local image=$1
	shift
	local want=""
	if [ "$1" = build_debian_standin ]; then
		want="debian-$(standin_debian_suite):$2"
	fi
	if docker image inspect "$image" >/dev/null 2>&1; then
		local what
		what=$(docker image inspect -f "{{index .Config.Labels \"$standin_label\"}}" "$image" 2>/dev/null) || true
		if [ -z "$what" ]; then
			note "$image: present"
			return
		fi
		if [ -z "$want" ] || [ "$what" = "$want" ]; then
			note "$image: present (stand-in: $what)"
			standin_used=true
			return
		fi
		note "$image: a stand-in of $what, not $want; building it again"
		local build=$1
		shift
		"$build" "$image" "$@"
		standin_used=true
		return
	fi
	note "$image: not present; trying docker pull (timeout ${DLOCK_PULL_TIMEOUT:-60}s)"
	if timeout "${DLOCK_PULL_TIMEOUT:-60}" docker pull -q "$image" >/dev/null 2>&1; then
		note "$image: pulled"
		return
	fi
	note "$image: pull failed; building a stand-in"
	local build=$1
	shift
	"$build" "$image" "$@"
	standin_used=true
}

step "Checking server images"
# One line per server kind: image, how to build its stand-in.
# The Redis stand-in comes from Debian trixie (Redis 8.0): the tests need
# Redis 7.2 or later, where WAIT counts only the connection's own writes
# (bookworm has 7.0). It also has Debian's libfaketime
# (/usr/lib/<arch>/faketime/libfaketimeMT.so.1): tests/servers'
# StartRedisFaketime runs redis-server under it to jump the server's clock.
# A stand-in built without it (an older script's) is built again.
standin_suite=trixie ensure_image "${DLOCK_REDIS_IMAGE:-redis:7.2}" build_debian_standin redis-server,libfaketime
ensure_image "${DLOCK_ETCD_IMAGE:-quay.io/coreos/etcd:v3.7.3}" build_etcd_standin
# Debian's zookeeper package (3.8 in bookworm) brings a JRE and keeps its
# scripts in /usr/share/zookeeper/bin; tests/servers runs
# `zkServer.sh start-foreground` with a config of its own, as it does in the
# official image.
ensure_image "${DLOCK_ZOOKEEPER_IMAGE:-zookeeper:3.8}" build_debian_standin zookeeper /usr/share/zookeeper/bin zookeeper_fixup
# Debian's postgresql package (15 in bookworm) keeps initdb and postgres in
# /usr/lib/postgresql/15/bin and creates the postgres user; tests/servers
# runs initdb and postgres itself (as that user, with setpriv), as it does in
# the official image.
ensure_image "${DLOCK_POSTGRES_IMAGE:-postgres:15}" build_debian_standin postgresql /usr/lib/postgresql/15/bin

# ---------------------------------------------------------------------------
# Test environment

step "Test environment"
if $standin_used; then
	# Stand-in images have no entrypoint and are run with host networking;
	# the Ryuk reaper image cannot be pulled where stand-ins are needed.
	export DLOCK_TEST_NETWORK=${DLOCK_TEST_NETWORK:-host}
	export TESTCONTAINERS_RYUK_DISABLED=${TESTCONTAINERS_RYUK_DISABLED:-true}
elif [ -z "${TESTCONTAINERS_RYUK_DISABLED:-}" ]; then
	ryuk=testcontainers/ryuk:0.14.0
	if ! docker image inspect "$ryuk" >/dev/null 2>&1 &&
		! timeout "${DLOCK_PULL_TIMEOUT:-60}" docker pull -q "$ryuk" >/dev/null 2>&1; then
		note "$ryuk is not available; disabling Ryuk"
		export TESTCONTAINERS_RYUK_DISABLED=true
	fi
fi
export DLOCK_REQUIRE_SERVERS=${DLOCK_REQUIRE_SERVERS:-1}
# Containers started by this run carry this label; they are removed on exit
# even if a test binary dies before cleaning up (Ryuk may be off).
export DLOCK_TEST_RUN=${DLOCK_TEST_RUN:-run-$$-$RANDOM}
for v in DLOCK_REDIS_IMAGE DLOCK_ETCD_IMAGE DLOCK_ZOOKEEPER_IMAGE DLOCK_POSTGRES_IMAGE DLOCK_TEST_NETWORK TESTCONTAINERS_RYUK_DISABLED DLOCK_REQUIRE_SERVERS; do
	if [ -n "${!v:-}" ]; then
		note "$v=${!v}"
	fi
done

if $setup_only; then
	unset DLOCK_TEST_RUN
	step "Setup done; to run tests by hand, export:"
	for v in DLOCK_TEST_NETWORK TESTCONTAINERS_RYUK_DISABLED DLOCK_REQUIRE_SERVERS; do
		[ -n "${!v:-}" ] && echo "export $v=${!v}"
	done
	exit 0
fi

cleanup() {
	local ids
	ids=$(docker ps -aq --filter "label=dlock.test.run=$DLOCK_TEST_RUN" 2>/dev/null) || return 0
	if [ -n "$ids" ]; then
		note "removing leftover test containers"
		# shellcheck disable=SC2086
		docker rm -f $ids >/dev/null 2>&1 || true
	fi
	# Networks of clusters in bridge mode.
	ids=$(docker network ls -q --filter "label=dlock.test.run=$DLOCK_TEST_RUN" 2>/dev/null) || return 0
	if [ -n "$ids" ]; then
		# shellcheck disable=SC2086
		docker network rm $ids >/dev/null 2>&1 || true
	fi
}
trap cleanup EXIT

# ---------------------------------------------------------------------------
# Tests

# Default to every package unless the arguments name one. The repository
# is several modules (go.work): ./... covers only the root module, so
# "every package" is every workspace module's ./dir/..., in one go test
# command; an argument ./... is read as that too.
all_pkgs=()
while read -r dir; do
	all_pkgs+=(".${dir#"$PWD"}/...")
done < <(go list -m -f '{{.Dir}}')
have_pkg=false
args=()
for a in "$@"; do
	case $a in
	./...) have_pkg=true; args+=("${all_pkgs[@]}"); continue ;;
	./* | ../* | */... | github.com/*) have_pkg=true ;;
	esac
	args+=("$a")
done
set -- ${args[@]+"${args[@]}"}
if ! $have_pkg; then
	set -- "$@" "${all_pkgs[@]}"
fi

race=-race
if [ "${DLOCK_TEST_RACE:-}" = off ]; then
	race=
fi
step "go test $race -count=1 -timeout 30m -v $*"
# The full verbose log goes to a file; the console shows each package's
# result, every top-level test of the conformance suite (so the log shows
# which backends ran it), and anything that failed or skipped.
# Each run has a log of its own (two runs on one machine must not write
# into one file), unless DLOCK_TEST_LOG names one.
if [ -n "${DLOCK_TEST_LOG:-}" ]; then
	log=$DLOCK_TEST_LOG
else
	log=$(mktemp "${TMPDIR:-/tmp}/dlock-test-$(date +%Y%m%d-%H%M%S)-XXXXXX.log")
fi
# run LOG ARGS...: go test ARGS, its verbose output to LOG; prints the
# summary (each package's result, every top-level test of the conformance
# suite, anything that failed or skipped, and the tests' log lines, such
# as the explorer's seeds and verdicts: a failed run's seed replays it,
# make explore SEED=N BACKEND=B), and exits on failure.
run() {
	local out=$1 status=0 start=$SECONDS
	shift
	note "full log: $out"
	# -timeout 30m: tests/matrix (the fault matrix and the explorer)
	# takes several minutes on a loaded machine, near go test's default
	# of 10.
	go test -count=1 -timeout 30m -v "$@" >"$out" 2>&1 || status=$?
	grep -E '^(ok|FAIL|panic:|\?|--- PASS: TestConformance|--- (FAIL|SKIP)|\s+--- (FAIL|SKIP)|\s+[a-z_]+\.go:[0-9]+:)' "$out" |
		sed -E 's/^--- PASS: (TestConformance[^ ]*)/    conformance suite passed: \1/' || true
	note "go test finished in $((SECONDS - start))s with status $status (full log: $out)"
	if [ "$status" -ne 0 ]; then
		note "last lines of $out:"
		tail -n 40 "$out" >&2
		exit "$status"
	fi
}
run "$log" $race "$@"
if $have_pkg || [ -z "$race" ]; then
	exit 0
fi
step "go test -count=1 -run TestExplore ./tests/matrix/ on ZooKeeper, without -race (step 6)"
DLOCK_EXPLORE_BACKEND=ZooKeeper run "${log%.log}-explore-zookeeper.log" -run TestExplore ./tests/matrix/
step "go test -count=1 ./tests/zookeeper/, without -race (step 6)"
run "${log%.log}-zookeeper.log" ./tests/zookeeper/
