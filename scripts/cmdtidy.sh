#!/usr/bin/env bash
# scripts/cmdtidy.sh — `go mod tidy` for a command's module (cmd/dlock),
# which requires the other dlock modules with no replace directive.
#
# `go install github.com/dlock-go/dlock/cmd/dlock@VERSION` refuses a module
# whose go.mod has replace directives, so cmd/dlock/go.mod has none: it
# requires the other dlock modules at the released version, and in the
# repository go.work makes it build from the checkout. Plain
# `GOWORK=off go mod tidy` there would fetch those modules at that version
# (unpublished before a release); this script tidies the module against the
# checkout instead: it copies go.mod and go.sum to a scratch directory, adds
# a replace directive for every other module of the checkout to its
# directory, runs `GOWORK=off go mod tidy -modfile` on the copy, drops those
# replace directives again and writes the result back (with -diff: prints
# the difference and fails if there is one). The go.sum so made has no lines
# for the dlock modules (replaced by directories, they need none); `go
# install PATH@VERSION` gets theirs from the checksum database, not from
# this file. scripts/proxycheck.sh checks, against the released modules in
# a module proxy, that the go.mod needs nothing more.
#
# Usage: scripts/cmdtidy.sh [-diff] [DIR]
#   DIR  the module's directory (default: this checkout's cmd/dlock); the
#        other modules are those of DIR's checkout
# After a change of cmd/dlock's imports run it instead of go mod tidy;
# `make lint` runs it with -diff, scripts/release.sh without.
set -euo pipefail

diff=false
if [ "${1:-}" = -diff ]; then
	diff=true
	shift
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$(cd "${1:-$here/cmd/dlock}" && pwd)
repo=$(git -C "$dir" rev-parse --show-toplevel)
rel=${dir#"$repo"/}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-cmdtidy.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp "$dir/go.mod" "$tmp/go.mod"
if [ -f "$dir/go.sum" ]; then cp "$dir/go.sum" "$tmp/go.sum"; else : >"$tmp/go.sum"; fi

if grep -qE '^[[:space:]]*replace([[:space:]]|\()' "$tmp/go.mod"; then
	echo "scripts/cmdtidy.sh: $rel/go.mod has replace directives: go install PATH@VERSION refuses them" >&2
	exit 1
fi

modpath() { sed -n 's/^module[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$1" | head -n 1; }
self=$(modpath "$dir/go.mod")
replaced=()
while read -r gomod; do
	d=$(dirname "$gomod")
	m=$(modpath "$gomod")
	case $m in
	"$self" | "") continue ;;
	github.com/dlock-go/dlock | github.com/dlock-go/dlock/*) ;;
	*) continue ;;
	esac
	go mod edit -replace="$m=$d" "$tmp/go.mod"
	replaced+=("$m")
done < <(find "$repo" -name go.mod -not -path '*/.git/*' -not -path '*/testdata/*')

(cd "$dir" && GOWORK=off GOFLAGS=-mod=mod go mod tidy -modfile="$tmp/go.mod")
for m in "${replaced[@]}"; do
	go mod edit -dropreplace="$m" "$tmp/go.mod"
done

if $diff; then
	status=0
	diff -u "$dir/go.mod" "$tmp/go.mod" --label "$rel/go.mod" --label "$rel/go.mod (tidy)" || status=1
	sum=$dir/go.sum
	[ -f "$sum" ] || sum=/dev/null
	diff -u "$sum" "$tmp/go.sum" --label "$rel/go.sum" --label "$rel/go.sum (tidy)" || status=1
	exit "$status"
fi
cp "$tmp/go.mod" "$dir/go.mod"
cp "$tmp/go.sum" "$dir/go.sum"
