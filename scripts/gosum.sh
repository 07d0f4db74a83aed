#!/usr/bin/env bash
# scripts/gosum.sh — what dlock puts into its users' go.sum (`make gosum`;
# `make lint` runs it, so CI does).
#
# For each scratch consumer below it writes, in a temporary directory
# outside the repository, a module whose main.go imports the listed
# packages, with a require and a replace directive (to this checkout) for
# every dlock module, and runs `GOWORK=off GOFLAGS=-mod=mod go mod tidy`
# (only the Go module proxy is needed). It counts the go.sum lines and
# prints a table. Modules replaced by local directories get no go.sum
# lines, so the "published" estimate adds 2 lines (the module's zip and
# go.mod hashes) per dlock module in the consumer's build list: what a user
# of the published modules would see.
#
# It fails when root+redis's estimate is above 30 lines, or when root+etcd
# needs more than the etcd client's own closure: its go.sum lines from other
# modules than dlock's (the count before the estimate's additions) above
# those of go.etcd.io/etcd/client/v3 alone. (Its estimate is always above
# the client's by dlock's own 2 x 2 lines, as any library's would be.)
#
# Usage: scripts/gosum.sh [REPO_DIR]   (default: this checkout). REPO_DIR
# may also be an older checkout with a single module (everything in the
# root go.mod), for a before/after comparison; the limits are then only
# reported.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo=$(cd "${1:-$here}" && pwd)
root_mod=github.com/dlock-go/dlock
redis_limit=30

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-gosum.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Every dlock module of the checkout: "module-path dir" lines (bench, the
# test servers and the tests module are no library modules, but replacing
# them too does no harm: a replace of a module not in the graph adds
# nothing).
mods=$(cd "$repo" && find . -name go.mod -not -path './.git/*' -not -path '*/testdata/*' | sort | while read -r f; do
	d=$(dirname "$f")
	m=$(sed -n 's/^module[[:space:]]*//p' "$f" | head -n 1)
	echo "$m $repo/${d#./}"
done | sed "s|$repo/\.\$|$repo|")
split=false
if echo "$mods" | grep -q "^$root_mod/redis "; then
	split=true
fi

# version MODULE: the version of MODULE required by the checkout's go.mod files.
version() {
	grep -h "^[[:space:]]*$1 v" "$repo/go.mod" "$repo"/*/go.mod 2>/dev/null | awk '{print $2}' | sort -V | tail -n 1
}
goredis=github.com/redis/go-redis/v9
etcdclient=go.etcd.io/etcd/client/v3

# consumer NAME PACKAGE...: measure a consumer importing the packages;
# prints "NAME lines dlock-modules estimate".
consumer() {
	local name=$1
	shift
	local dir=$tmp/$name
	mkdir -p "$dir"
	{
		echo "module example.com/consumer"
		echo
		echo "go $(sed -n 's/^go[[:space:]]*//p' "$repo/go.mod" | head -n 1)"
		echo
	} >"$dir/go.mod"
	{
		echo "package main"
		echo
		echo "import ("
		local p
		for p in "$@"; do
			echo "	_ \"$p\""
		done
		echo ")"
		echo
		echo "func main() {}"
	} >"$dir/main.go"
	for p in "$@"; do
		case $p in
		"$root_mod" | "$root_mod"/*)
			# The module of p: the longest dlock module path that prefixes it.
			local best="" m d
			while read -r m d; do
				if [ "$p" = "$m" ] || [ "${p#"$m"/}" != "$p" ]; then
					[ ${#m} -gt ${#best} ] && best=$m
				fi
			done <<<"$mods"
			echo "require $best v0.0.0-00010101000000-000000000000" >>"$dir/go.mod"
			;;
		"$goredis") echo "require $goredis $(version "$goredis")" >>"$dir/go.mod" ;;
		"$etcdclient") echo "require $etcdclient $(version "$etcdclient")" >>"$dir/go.mod" ;;
		esac
	done
	local m d
	while read -r m d; do
		echo "replace $m => $d" >>"$dir/go.mod"
	done <<<"$mods"
	if ! (cd "$dir" && GOWORK=off GOFLAGS=-mod=mod go mod tidy >"$dir/tidy.log" 2>&1); then
		cat "$dir/tidy.log" >&2
		echo "scripts/gosum.sh: go mod tidy failed for $name" >&2
		exit 1
	fi
	local lines=0 n
	[ -f "$dir/go.sum" ] && lines=$(wc -l <"$dir/go.sum")
	n=$(cd "$dir" && GOWORK=off GOFLAGS=-mod=mod go list -m all | grep -c "^$root_mod\( \|/\)" || true)
	echo "$name $lines $n $((lines + 2 * n))"
}

results=()
results+=("$(consumer go-redis-alone "$goredis")")
results+=("$(consumer etcd-client-alone "$etcdclient")")
results+=("$(consumer root+redis "$root_mod" "$root_mod/redis")")
results+=("$(consumer root+etcd "$root_mod" "$root_mod/etcd")")
results+=("$(consumer root+zookeeper "$root_mod" "$root_mod/zookeeper")")
results+=("$(consumer root+redlock "$root_mod" "$root_mod/redlock")")
results+=("$(consumer root+fence "$root_mod" "$root_mod/fence")")
if [ -f "$repo/otel/go.mod" ] || { ! $split && [ -d "$repo/otel" ]; }; then
	results+=("$(consumer root+otel "$root_mod" "$root_mod/otel")")
fi

printf '%-20s %14s %14s %20s\n' consumer "go.sum lines" "dlock modules" "published estimate"
for r in "${results[@]}"; do
	# shellcheck disable=SC2086
	printf '%-20s %14s %14s %20s\n' $r
done

get() { # get [lines]: the estimate (or go.sum lines) of consumer $name
	local r what=${1:-estimate}
	for r in "${results[@]}"; do
		# shellcheck disable=SC2086
		set -- $r
		if [ "$1" = "$name" ]; then
			if [ "$what" = lines ]; then echo "$2"; else echo "$4"; fi
			return
		fi
	done
}
name=root+redis redis_est=$(get)
name=root+etcd etcd_lines=$(get lines)
name=etcd-client-alone etcd_alone=$(get lines)

status=0
if [ "$redis_est" -gt "$redis_limit" ]; then
	echo "root+redis: published estimate $redis_est > $redis_limit go.sum lines" >&2
	status=1
fi
if [ "$etcd_lines" -gt "$etcd_alone" ]; then
	echo "root+etcd: $etcd_lines go.sum lines besides dlock's own > the etcd client's own $etcd_alone" >&2
	status=1
fi
if ! $split; then
	echo "(a single-module checkout: limits reported, not enforced)" >&2
	status=0
fi
exit "$status"
