#!/usr/bin/env bash
# scripts/release.sh — prepare, and with --tag make, a release of every
# dlock module at one version.
#
# Usage: scripts/release.sh [--tag] VERSION [REPO_DIR]
#   VERSION   a semantic version, v0.x.y or v1.x.y (v2+ would need /v2
#             module paths), e.g. v0.1.0 or v0.2.0-rc.1
#   REPO_DIR  the checkout to release (default: this script's)
#
# The repository is several modules (docs/development.md, "Modules") that require each
# other. Users get them from the Go module proxy, which ignores the replace
# directives of a dependency's go.mod: etcd/go.mod must require the root at
# a version the proxy serves. So this script
#   1. sets every requirement of a github.com/dlock-go/dlock* module, in
#      every go.mod of the checkout (the development module, tests,
#      included), to VERSION; the replace directives stay (a consumer
#      ignores them; in the repository they make every module build from
#      the checkout, with or without go.work), except in the command's
#      module, cmd/dlock, which has none: `go install
#      github.com/dlock-go/dlock/cmd/dlock@VERSION` refuses a go.mod with
#      replace directives (in the repository go.work makes it use the
#      checkout);
#   2. tidies each module on its own (GOWORK=off; cmd/dlock with
#      scripts/cmdtidy.sh, against the checkout, since the other modules are
#      not published at VERSION yet);
#   3. prints the tags Go needs for a multi-module repository: VERSION for
#      the root module and DIR/VERSION for the module in DIR
#      (etcd/v0.1.0, otel/v0.1.0, ...), all on one commit.
# With --tag (clean working tree required) it commits the go.mod/go.sum
# changes, if any ("release VERSION: ..."), and creates those tags at that
# commit; pushing the commit and the tags (git push origin main --tags)
# publishes the release.
#
# Between releases main's go.mod files keep requiring the last released
# version (v0.1.0 is the first, planned); the replace directives make the
# repository use its own code. Running the script again at the same
# VERSION changes nothing, so --tag may also be run on a commit that is
# already prepared. scripts/proxycheck.sh runs it in a scratch clone and
# proves the tagged modules resolve through a module proxy.
set -euo pipefail

tag=false
if [ "${1:-}" = --tag ]; then
	tag=true
	shift
fi
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: scripts/release.sh [--tag] VERSION [REPO_DIR]" >&2
	exit 2
fi
version=$1
if ! [[ $version =~ ^v[01]\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$ ]]; then
	echo "scripts/release.sh: $version: want a semantic version v0.x.y or v1.x.y (optionally -prerelease)" >&2
	exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo=$(cd "${2:-$here}" && git rev-parse --show-toplevel)
cd "$repo"

if $tag; then
	if [ -n "$(git status --porcelain)" ]; then
		echo "scripts/release.sh: --tag needs a clean working tree:" >&2
		git status --short >&2
		exit 1
	fi
fi

# The modules of commands users install with `go install PATH@VERSION`,
# which refuses a go.mod with replace directives: they require the other
# dlock modules with none (in the repository go.work supplies the
# checkout) and scripts/cmdtidy.sh tidies them.
commands="cmd/dlock"

# The module directories, root first ("." then e.g. "etcd").
dirs=$(find . -name go.mod -not -path './.git/*' -not -path '*/testdata/*' | sed 's|^\./||; s|/\?go\.mod$||' | sed 's|^$|.|' | sort)

# directives GOMOD: "require PATH" and "replace PATH" lines for the dlock
# modules a go.mod requires or replaces (single lines and blocks).
directives() {
	awk '
	/^(require|replace)[ \t]*\(/ { blk = $1; next }
	blk != "" && /^[ \t]*\)/ { blk = ""; next }
	{
		if (blk != "") { verb = blk; path = $1 }
		else if ($1 == "require" || $1 == "replace") { verb = $1; path = $2 }
		else next
		if (path ~ /^github\.com\/dlock-go\/dlock(\/|$)/) print verb, path
	}' "$1"
}

tags=()
for d in $dirs; do
	reqs=$(directives "$d/go.mod" | sed -n 's/^require //p' | sort -u)
	if [[ " $commands " == *" $d "* ]]; then
		# A command's module: no replace directive (go install refuses
		# them); tidied against the checkout by scripts/cmdtidy.sh.
		if directives "$d/go.mod" | grep -q '^replace '; then
			echo "scripts/release.sh: $d/go.mod has a replace directive for a dlock module: go install github.com/dlock-go/dlock/$d@$version would refuse it" >&2
			exit 1
		fi
		for p in $reqs; do
			go mod edit -require="$p@$version" "$d/go.mod"
		done
		if ! out=$("$here/scripts/cmdtidy.sh" "$d" 2>&1); then
			echo "$out" >&2
			echo "scripts/release.sh: scripts/cmdtidy.sh failed in $d" >&2
			exit 1
		fi
		if [ "$d" = . ]; then tags+=("$version"); else tags+=("$d/$version"); fi
		continue
	fi
	for p in $reqs; do
		if ! directives "$d/go.mod" | grep -qx "replace $p"; then
			echo "scripts/release.sh: $d/go.mod requires $p without a replace directive to its directory" >&2
			exit 1
		fi
		go mod edit -require="$p@$version" "$d/go.mod"
	done
	if ! out=$(cd "$d" && GOWORK=off go mod tidy 2>&1); then
		echo "$out" >&2
		echo "scripts/release.sh: go mod tidy failed in $d" >&2
		exit 1
	fi
	if [ "$d" = . ]; then tags+=("$version"); else tags+=("$d/$version"); fi
done

changed=$(git status --porcelain -- $(for d in $dirs; do echo "$d/go.mod" "$d/go.sum"; done) | awk '{print $2}')
if ! $tag; then
	if [ -n "$changed" ]; then
		echo "# go.mod/go.sum files changed (commit them, then tag that commit):"
		printf '#   %s\n' $changed
	fi
	echo "# the tags of release $version:"
	for t in "${tags[@]}"; do
		echo "git tag $t"
	done
	exit 0
fi

for t in "${tags[@]}"; do
	if git rev-parse -q --verify "refs/tags/$t" >/dev/null; then
		echo "scripts/release.sh: tag $t exists already" >&2
		exit 1
	fi
done
if [ -n "$changed" ]; then
	# shellcheck disable=SC2086
	git add -- $changed
	# shellcheck disable=SC2086
	git commit -q -m "release $version: every inter-module requirement at $version" -- $changed
fi
for t in "${tags[@]}"; do
	git tag "$t"
	echo "tagged $t at $(git rev-parse --short HEAD)"
done
