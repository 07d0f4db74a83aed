#!/usr/bin/env bash
# scripts/proxycheck.sh — dlock's modules as a user gets them: from a
# module proxy, at a tagged version, with no replace directive
# (`make proxycheck`; `make lint` runs it through scripts/gosum.sh).
#
# 1. Clones the checkout (its working tree: uncommitted changes and new
#    files included) into a scratch directory and runs scripts/release.sh
#    --tag VERSION there (default VERSION v0.999.0-proxycheck, a test version).
# 2. Builds a file-based GOPROXY (https://go.dev/ref/mod#goproxy-protocol:
#    @v/list, .info, .mod, .zip) holding every tagged module from the
#    tagged tree (tests/modproxy: golang.org/x/mod/zip.CreateFromDir).
# 3. In scratch consumer modules outside the repository (root alone,
#    root+redis, root+etcd, root+zookeeper, root+redlock, root+fence, root+otel, and
#    go-redis alone / the etcd client alone as baselines), with
#    GOWORK=off, a fresh GOMODCACHE, GOPROXY=that proxy, then this
#    machine's module cache, then `go env GOPROXY` without "direct" (so no
#    network but the Go module proxy), GONOSUMDB=github.com/dlock-go and
#    -mod=mod: `go get BACKEND@VERSION` (the root module must come from
#    the backend's own requirements), `go mod tidy`, `go build` of a main
#    package importing the root and the backend, and checks that every
#    dlock module in the build list is at VERSION.
# 4. The command: cmd/dlock as released, resolved from the proxy, needs
#    nothing but the dlock modules' go.sum lines (scripts/cmdtidy.sh), and
#    `go install github.com/dlock-go/dlock/cmd/dlock@VERSION` (-mod=mod) in
#    a fresh module cache works (it refuses a go.mod with replace
#    directives), and the installed binary runs `dlock help`.
# It fails if any step fails: e.g. a go.mod requiring another dlock module
# at a version no proxy serves.
#
# Usage: scripts/proxycheck.sh [--out DIR] [--version VERSION] [REPO_DIR]
#   --out DIR  keep the proxy (DIR/proxy) and the consumers
#              (DIR/consumers/NAME, with their go.sum) in DIR, which must
#              be empty or missing (scripts/gosum.sh counts those go.sum)
#   REPO_DIR   the checkout (default: this one); an older single-module
#              checkout works too
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=""
version=v0.999.0-proxycheck
while [ $# -gt 0 ]; do
	case $1 in
	--out) out=$2; shift 2 ;;
	--version) version=$2; shift 2 ;;
	-*) echo "usage: scripts/proxycheck.sh [--out DIR] [--version VERSION] [REPO_DIR]" >&2; exit 2 ;;
	*) break ;;
	esac
done
repo=$(cd "${1:-$here}" && git rev-parse --show-toplevel)
root_mod=github.com/dlock-go/dlock

# cleancaches: the scratch module caches (read-only files) removed.
cleancaches() {
	local c
	for c in "$tmp/modcache" "$tmp"/install/*/modcache; do
		[ -d "$c" ] && GOMODCACHE=$c go clean -modcache
	done
	return 0
}
if [ -n "$out" ]; then
	mkdir -p "$out"
	tmp=$(cd "$out" && pwd)
	if [ -n "$(ls -A "$tmp")" ]; then
		echo "scripts/proxycheck.sh: --out $out is not empty" >&2
		exit 2
	fi
	cleanup() { cleancaches; rm -rf "$tmp/src" "$tmp/modcache" "$tmp/install"; }
else
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-proxycheck.XXXXXX")
	cleanup() { cleancaches; rm -rf "$tmp"; }
fi
trap cleanup EXIT

# 1. A scratch clone holding the working tree, released and tagged.
src=$tmp/src
git clone -q "$repo" "$src"
git -C "$src" config user.name proxycheck
git -C "$src" config user.email proxycheck@invalid
if ! git -C "$repo" diff --quiet HEAD; then
	git -C "$repo" diff --binary HEAD | git -C "$src" apply
fi
git -C "$repo" ls-files -z --others --exclude-standard | (cd "$repo" && tar --null -T - -cf -) | tar -C "$src" -xf -
git -C "$src" add -A
if ! git -C "$src" diff --cached --quiet; then
	git -C "$src" commit -q -m "proxycheck: the working tree of $repo"
fi
echo "== scripts/release.sh --tag $version (in a scratch clone)"
"$here/scripts/release.sh" --tag "$version" "$src"

# 2. The proxy, from the tagged tree (git archive: exactly what is committed).
tree=$tmp/tree
mkdir -p "$tree"
git -C "$src" archive --format=tar HEAD | tar -C "$tree" -xf -
dirs=()
while read -r t; do
	d=${t%"$version"}
	d=${d%/}
	dirs+=("$tree/${d:-.}")
done < <(git -C "$src" tag --points-at HEAD | grep -E "(^|/)${version//./\\.}\$")
(cd "$here/tests" && GOWORK=off go build -o "$tmp/modproxy" ./modproxy)
"$tmp/modproxy" -out "$tmp/proxy" -version "$version" -time "$(git -C "$src" log -1 --format=%cI)" "${dirs[@]}"
rm -rf "$tree" "$tmp/modproxy"
echo "== file proxy $tmp/proxy: ${#dirs[@]} modules at $version"

# 3. The consumers.
modcache=$(go env GOMODCACHE)
upstream=$(go env GOPROXY | tr ',|' '\n\n' | grep -v -x -e direct -e off | paste -sd, -)
export GOWORK=off
export GOPROXY="file://$tmp/proxy,file://$modcache/cache/download${upstream:+,$upstream}"
export GOMODCACHE=$tmp/modcache
export GONOSUMDB=github.com/dlock-go
export GOFLAGS="$(go env GOFLAGS) -mod=mod"
mkdir -p "$GOMODCACHE/cache/download"
# The checksum database's cached tiles, so that lookups need not repeat.
[ -d "$modcache/cache/download/sumdb" ] && cp -r "$modcache/cache/download/sumdb" "$GOMODCACHE/cache/download/"

goversion=$(sed -n 's/^go[[:space:]]*//p' "$src/go.mod" | head -n 1)
# version MODULE: the version of MODULE required by the checkout's go.mod files.
reqversion() {
	grep -h "^[[:space:]]*$1 v" "$src/go.mod" "$src"/*/go.mod 2>/dev/null | awk '{print $2}' | sort -V | tail -n 1
}

# consumer NAME PACKAGE...: a module importing the packages (dlock ones at
# $version, others at the version the checkout requires).
consumer() {
	local name=$1 p
	shift
	local dir=$tmp/consumers/$name
	mkdir -p "$dir"
	printf 'module example.com/consumer\n\ngo %s\n' "$goversion" >"$dir/go.mod"
	{
		echo "package main"
		echo
		echo "import ("
		for p in "$@"; do echo "	_ \"$p\""; done
		echo ")"
		echo
		echo "func main() {}"
	} >"$dir/main.go"
	# go get names the backend alone, as a user would: the root module
	# must come from the backend's requirements (main.go imports it too).
	local args=()
	for p in "$@"; do
		case $p in
		"$root_mod" | "$root_mod"/*)
			[ -d "$src/${p#"$root_mod"}" ] || { echo "-- $name: skipped ($p not in the checkout)"; rm -rf "$dir"; return; }
			[ "$p" = "$root_mod" ] && [ $# -gt 1 ] && continue
			args+=("$p@$version")
			;;
		*) args+=("$p@$(reqversion "$p")") ;;
		esac
	done
	if ! (cd "$dir" && go get "${args[@]}" && go mod tidy && go build -o /dev/null .) >"$dir/log" 2>&1; then
		cat "$dir/log" >&2
		echo "FAIL $name: go get ${args[*]}; go mod tidy; go build (GOPROXY=$GOPROXY, no replace)" >&2
		return 1
	fi
	if grep -q '^replace' "$dir/go.mod"; then
		echo "FAIL $name: go.mod has a replace directive" >&2
		return 1
	fi
	local bad
	bad=$(cd "$dir" && go list -m all | awk -v m="$root_mod" -v v="$version" '($1 == m || index($1, m "/") == 1) && $2 != v')
	if [ -n "$bad" ]; then
		echo "FAIL $name: dlock modules not at $version: $bad" >&2
		return 1
	fi
	echo "ok $name: go get ${args[*]}; go mod tidy; go build ($(wc -l <"$dir/go.sum") go.sum lines)"
}

# goinstall PATH: `go install PATH@$version` in a fresh module cache, from
# the proxy (as `go install github.com/dlock-go/dlock/cmd/dlock@latest` from
# a clean cache), then `BINARY help`. go install refuses a module whose
# go.mod has replace directives: the command's module must require the
# other dlock modules at $version without them.
goinstall() {
	local path=$1 name=${1##*/}
	[ -d "$src/${path#"$root_mod"/}" ] || { echo "-- go install $path: skipped (not in the checkout)"; return; }
	local dir=$tmp/install/$name
	mkdir -p "$dir/bin" "$dir/modcache"
	if ! (cd "$dir" && GOMODCACHE=$dir/modcache GOBIN=$dir/bin GOFLAGS=-mod=mod \
		go install "$path@$version" && "$dir/bin/$name" help >"$dir/help") >"$dir/log" 2>&1; then
		cat "$dir/log" >&2
		echo "FAIL go install $path@$version in a clean module cache (GOPROXY=$GOPROXY), then $name help" >&2
		return 1
	fi
	echo "ok go install $path@$version (clean module cache); $name help: $(head -n 1 "$dir/help")"
}

# cmdtidy DIR: the command's module as released, resolved from the proxy
# (GOWORK=off, no replace): go mod tidy would only add the go.sum lines of
# the dlock modules (scripts/cmdtidy.sh, run by release.sh before they are
# published, cannot know them; go install takes them from the checksum
# database), nothing else: its requirements are complete and minimal.
cmdtidy() {
	local d=$src/$1 out bad
	[ -f "$d/go.mod" ] || { echo "-- $1: skipped (not in the checkout)"; return; }
	if ! out=$(cd "$d" && go mod tidy -diff 2>"$tmp/cmdtidy.err"); then
		if [ -z "$out" ]; then
			cat "$tmp/cmdtidy.err" >&2
			echo "FAIL $1: go mod tidy -diff (GOPROXY=$GOPROXY, no replace)" >&2
			return 1
		fi
	fi
	bad=$(printf '%s\n' "$out" | grep -E '^[-+]' | grep -vE '^(\+\+\+|---) ' | grep -vE "^\+${root_mod//./\\.}(/[^ ]*)? " || true)
	if [ -n "$bad" ]; then
		printf '%s\n' "$out" >&2
		echo "FAIL $1: released at $version, its go.mod/go.sum are not tidy once the dlock modules come from the proxy (above: more than their go.sum lines)" >&2
		return 1
	fi
	echo "ok $1: tidy from the proxy at $version (go mod tidy would add only the dlock modules' $(printf '%s\n' "$out" | grep -c "^+$root_mod") go.sum lines)"
}

status=0
cmdtidy cmd/dlock || status=1
goinstall "$root_mod/cmd/dlock" || status=1
consumer go-redis-alone github.com/redis/go-redis/v9 || status=1
consumer etcd-client-alone go.etcd.io/etcd/client/v3 || status=1
consumer root "$root_mod" || status=1
for b in redis etcd zookeeper redlock fence otel; do
	consumer "root+$b" "$root_mod" "$root_mod/$b" || status=1
done
if [ "$status" -ne 0 ]; then
	echo "scripts/proxycheck.sh: FAILED: dlock's modules do not resolve from a module proxy as published at $version" >&2
fi
exit "$status"
