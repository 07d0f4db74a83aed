#!/usr/bin/env bash
# scripts/gosum.sh — what dlock puts into its users' go.sum (`make gosum`;
# `make lint` runs it, so CI does).
#
# It runs scripts/proxycheck.sh, which releases the checkout at a test
# version in a scratch clone, serves every module from a file-based module
# proxy and, in scratch consumer modules outside the repository with no
# replace directive, runs `go get BACKEND@VERSION`, `go mod tidy` and
# `go build` (only the Go module proxy is needed). The go.sum lines counted
# here are those consumers' real ones, dlock's own modules' hashes included:
# what a user of the published modules gets.
#
# It fails when root+redis has more than 30 go.sum lines, or when root+etcd
# adds more than the etcd client's own closure to the root alone: its go.sum
# lines from other modules than dlock's above those of the root alone plus
# those of go.etcd.io/etcd/client/v3 alone. (The root module holds the Redis
# and ZooKeeper backends, so a consumer of the root alone has the go.mod
# hashes of go-redis and zk in its go.sum, though it builds neither; dlock's
# own hashes are not counted, as any library's would be.) proxycheck.sh's
# own failures fail it too.
#
# Usage: scripts/gosum.sh [REPO_DIR]   (default: this checkout). REPO_DIR
# may also be an older checkout with a single module (everything in the
# root go.mod), for a before/after comparison; the limits are then only
# reported.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo=$(cd "${1:-$here}" && pwd)
redis_limit=30

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-gosum.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

split=false
[ -f "$repo/etcd/go.mod" ] && split=true

check=0
"$here/scripts/proxycheck.sh" --out "$tmp" "$repo" || check=$?

printf '%-20s %14s %14s %14s\n' consumer "go.sum lines" "dlock's lines" "third-party"
declare -A total third
for dir in "$tmp"/consumers/*/; do
	name=$(basename "$dir")
	[ -f "$dir/go.sum" ] || continue
	n=$(wc -l <"$dir/go.sum")
	d=$(grep -c '^github.com/dlock-go/' "$dir/go.sum" || true)
	total[$name]=$n
	third[$name]=$((n - d))
	printf '%-20s %14s %14s %14s\n' "$name" "$n" "$d" "$((n - d))"
done

status=$check
if [ -z "${total[root+redis]:-}" ] || [ -z "${third[root+etcd]:-}" ] || [ -z "${third[root]:-}" ] || [ -z "${total[etcd-client-alone]:-}" ]; then
	echo "scripts/gosum.sh: a consumer was not measured (see proxycheck's output)" >&2
	status=1
else
	if [ "${total[root+redis]}" -gt "$redis_limit" ]; then
		echo "root+redis: ${total[root+redis]} > $redis_limit go.sum lines" >&2
		status=1
	fi
	if [ "${third[root+etcd]}" -gt "$((third[root] + total[etcd-client-alone]))" ]; then
		echo "root+etcd: ${third[root+etcd]} go.sum lines besides dlock's own > the root alone's ${third[root]} + the etcd client's own ${total[etcd-client-alone]}" >&2
		status=1
	fi
fi
if ! $split; then
	echo "(a single-module checkout: limits reported, not enforced)" >&2
	status=0
fi
exit "$status"
