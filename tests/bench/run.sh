#!/usr/bin/env bash
# tests/bench/run.sh — dlock beside its peers on the same servers, in one run,
# and the benchstat tables (`make peers` runs it).
#
#   tests/bench/run.sh                 # 6 passes, -benchtime 1s, every benchmark
#   tests/bench/run.sh --smoke         # every benchmark once (-benchtime 1x, the
#                                # scale workloads shrunk by
#                                # DLOCK_BENCH_SMALL=1), no tables: catches
#                                # a broken harness
#   tests/bench/run.sh --tables RAW    # only the tables, from the raw output RAW
#                                # of earlier runs (several concatenated)
#
# Knobs (environment): COUNT (passes, default 6), BENCHTIME (default 1s; keep it a
# duration: the scale workloads run once per iteration and skip themselves
# under an iteration count such as 2000x), BENCH (the -bench regexp,
# default every peer and scale benchmark of this module but the Redlock
# package's own), OUT (directory for the raw output and the tables,
# default a new temporary directory).
#
# It sets the servers up as `make test` does (scripts/test.sh --setup-only),
# runs this module's benchmarks COUNT times (each pass one test binary,
# which starts the servers through tests/servers), and prints a
# dlock ÷ peer summary and, per backend and peer, a benchstat table with
# the peer as the base column, so the dlock column reads "dlock vs peer";
# for BenchmarkSemaphore, the permits/s of dlock and of each peer and
# dlock ÷ peer per pass (median [min-max] over the passes). A section is
# printed only when its benchmarks ran (BENCH='^BenchmarkSemaphore$': the
# semaphore tables alone).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

smoke=false tables_only=""
case "${1:-}" in
--smoke) smoke=true ;;
--tables) tables_only="${2:?--tables needs the raw output file}" ;;
esac

if [ -z "$tables_only" ]; then
	env=$("$root/scripts/test.sh" --setup-only)
	eval "$env"
fi

cd "$here"
# bench is a module of its own, outside the repository's go.work.
export GOWORK=off
if $smoke; then
	DLOCK_BENCH_SMALL=1 exec go test -run '^$' -bench "${BENCH:-.}" -benchtime 1x -count 1 -timeout 20m .
fi

count="${COUNT:-6}"
benchtime="${BENCHTIME:-1s}"
bench="${BENCH:-^Benchmark(Cycle|Handoff|Semaphore|ScaleLeases|ScaleWaiters)$}"
out="${OUT:-$(mktemp -d /tmp/dlock-peers.XXXXXX)}"
mkdir -p "$out"

if ! command -v benchstat >/dev/null; then
	go install golang.org/x/perf/cmd/benchstat@latest
	PATH="$PATH:$(go env GOPATH)/bin"
fi

# COUNT passes of -count 1, rather than one -count COUNT: -count repeats
# each benchmark back to back, so a burst of load from elsewhere on a
# shared machine would land on one library's runs; passes alternate the
# libraries in time. Each pass is one test binary: it starts the servers,
# and every library of a backend runs on the same ones.
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
failed=0
if [ -n "$tables_only" ]; then
	[ "$tables_only" -ef "$out/raw.txt" ] || cp "$tables_only" "$out/raw.txt"
else
	go test -c -o "$bin/bench.test" .
	start=$(date +%s)
	: >"$out/raw.txt"
	for pass in $(seq "$count"); do
		echo "==> pass $pass of $count: -test.bench '$bench' -test.benchtime $benchtime (raw output: $out/raw.txt)" >&2
		# A failed benchmark fails its pass; the other passes still run
		# and the tables are still printed, from what was measured.
		DLOCK_TEST_RUN="${DLOCK_TEST_RUN:-dlock-peers-$$}" "$bin/bench.test" -test.run '^$' -test.bench "$bench" \
			-test.benchtime "$benchtime" -test.count 1 -test.timeout 0 >>"$out/raw.txt" 2>>"$out/stderr.txt" || {
			failed=$((failed + 1))
			echo "==> pass $pass FAILED:" >&2
			grep -A3 -E '^(--- FAIL|panic)' "$out/raw.txt" | tail -n 20 >&2 || true
		}
	done
	echo "==> took $(($(date +%s) - start))s" >&2
fi

# Keep only benchmark lines and the header lines benchstat needs (the
# servers' start-up log goes to stderr, but be safe).
grep -E '^(Benchmark|goos:|goarch:|pkg:|cpu:)' "$out/raw.txt" >"$out/bench.txt"

pairs="redis:raw redis:redislock redis:redsync redlock:redsync etcd:mutex-reused etcd:mutex-session zookeeper:zklock etcd3:mutex-reused etcd3:mutex-session zookeeper3:zklock"

# ratios BACKEND PEER: one Markdown row, dlock ÷ peer of the benchstat
# medians (cycles/s at W=1, W=16 and W=16 with a client each, handoffs/s under contention; the
# handoff wait p50 and p99 side by side, dlock / peer; spread side by
# side), "~" after a ratio that benchstat does not call significant
# (alpha 0.05).
ratios() {
	benchstat -format csv -filter ".name:(Cycle OR Handoff) /backend:$1 /lib:($2 OR dlock)" -col "/lib@($2 dlock)" "$out/bench.txt" 2>/dev/null |
		awk -F, -v pair="$1 / $2" '
		BEGIN { w1 = w16 = w16c = ho = p50 = p99 = sp = "n/a" }
		function r(a, b, sig) { if (a == "" || b == "" || a + 0 == 0) return "n/a"; return sprintf("%.2f%s", b / a, sig == "~" ? " ~" : "") }
		function v(x) { return x == "" ? "n/a" : sprintf("%.3g", x) }
		# A table: a line naming the columns (one library when only one
		# has the unit), then the unit line, then the rows.
		/^,/ && !/,CI/ { only = ($3 == "" && $4 == "") ? $2 : ""; next }
		/^,[^,]*,CI/ { unit = $2; next }
		{
			if (only == "dlock") { p = ""; d = $2; sig = "" }
			else if (only != "") { p = $2; d = ""; sig = "" }
			else { p = $2; d = $4; sig = $6 }
		}
		unit == "cycles/s" && $1 ~ /^Cycle\/.*\/w=1(-[0-9]+)?$/ { w1 = r(p, d, sig) }
		unit == "cycles/s" && $1 ~ /^Cycle\/.*\/w=16(-[0-9]+)?$/ { w16 = r(p, d, sig) }
		unit == "cycles/s" && $1 ~ /^Cycle\/.*\/w=16c(-[0-9]+)?$/ { w16c = r(p, d, sig) }
		unit == "handoffs/s" && $1 ~ /^Handoff\// { ho = r(p, d, sig) }
		unit == "p50-ms" && $1 ~ /^Handoff\// { p50 = v(d) " / " v(p) }
		unit == "p99-ms" && $1 ~ /^Handoff\// { p99 = v(d) " / " v(p) }
		unit == "spread" && $1 ~ /^Handoff\// { sp = v(d) " / " v(p) }
		END { printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", pair, w1, w16, w16c, ho, p50, p99, sp }'
}

# The semaphore pairs (BenchmarkSemaphore: 16 workers, each its own client,
# on a semaphore of 4 permits): Redisson's RPermitExpirableSemaphore and
# RSemaphore (on go-redis), Curator's InterProcessSemaphoreV2 (on
# go-zookeeper), a naive recipe on etcd's concurrency package.
sempairs="redis:redisson-pes redis:redisson-sem zookeeper:curator etcd:naive"

# semratios: one Markdown row per semaphore pair and hold, read from the raw
# lines: the median permits/s of dlock and of the peer over the passes,
# dlock ÷ peer computed within each pass (the two ran minutes apart at
# most, on the same servers) as median [min-max], the median peak of
# permits held at once and the median server ops and writes per permit
# (dlock / peer), and the number of passes with both.
# A pass begins at each "goos:" header (one per test binary).
semratios() {
	awk -v pairs="$sempairs" '
	function med(a, n, i, j, t) {
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	function f(x) { return x >= 100 ? sprintf("%.0f", x) : sprintf("%.3g", x) }
	/^goos:/ { pass++ }
	/^BenchmarkSemaphore\// {
		split($1, p, "/"); be = p[2]; sub(/^backend=/, "", be); hold = p[3]; sub(/^hold=/, "", hold)
		lib = p[4]; sub(/^lib=/, "", lib); sub(/-[0-9]+$/, "", lib)
		if (!((be, hold) in seenhold)) { seenhold[be, hold] = 1; holds[be] = holds[be] " " hold }
		for (i = 3; i < NF; i += 2) {
			if ($(i + 1) == "permits/s") rate[be, hold, lib, pass] = $i
			if ($(i + 1) == "peak-held") peak[be, hold, lib, pass] = $i
			if ($(i + 1) == "srv-ops/permit") ops[be, hold, lib, pass] = $i
			if ($(i + 1) == "srv-writes/permit") wr[be, hold, lib, pass] = $i
		}
	}
	END {
		np = split(pairs, pr, " ")
		for (k = 1; k <= np; k++) {
			split(pr[k], bp, ":"); be = bp[1]; peer = bp[2]
			nh = split(holds[be], hs, " ")
			for (h = 1; h <= nh; h++) {
				hold = hs[h]; n = 0; delete d; delete q; delete r; delete pd; delete pq; delete od; delete oq; delete wd; delete wq; no = nw = 0
				for (ps = 1; ps <= pass; ps++) {
					if (!((be, hold, "dlock", ps) in rate) || !((be, hold, peer, ps) in rate)) continue
					n++; d[n] = rate[be, hold, "dlock", ps]; q[n] = rate[be, hold, peer, ps]
					r[n] = q[n] > 0 ? d[n] / q[n] : 0
					pd[n] = peak[be, hold, "dlock", ps]; pq[n] = peak[be, hold, peer, ps]
					if ((be, hold, "dlock", ps) in ops && (be, hold, peer, ps) in ops) { no++; od[no] = ops[be, hold, "dlock", ps]; oq[no] = ops[be, hold, peer, ps] }
					if ((be, hold, "dlock", ps) in wr && (be, hold, peer, ps) in wr) { nw++; wd[nw] = wr[be, hold, "dlock", ps]; wq[nw] = wr[be, hold, peer, ps] }
				}
				if (n == 0) continue
				lo = hi = r[1]; for (i = 2; i <= n; i++) { if (r[i] < lo) lo = r[i]; if (r[i] > hi) hi = r[i] }
				rm = med(r, n)
				o = no ? f(med(od, no)) " / " f(med(oq, no)) : "n/a"
				w = nw ? f(med(wd, nw)) " / " f(med(wq, nw)) : "n/a"
				printf "| %s / %s | %s | %s | %s | %.2f [%.2f-%.2f] | %s / %s | %s | %s | %d |\n", be, peer, hold, f(med(d, n)), f(med(q, n)), rm, lo, hi, f(med(pd, n)), f(med(pq, n)), o, w, n
			}
		}
	}' "$out/bench.txt"
}

# scale NAME "UNITS" "MAXUNITS": a Markdown table of Benchmark NAME's
# runs, one row per sub-benchmark, the median of each unit over the runs
# (and the maximum too for MAXUNITS), read from the raw lines.
scale() {
	{ grep -E "^Benchmark$1/" "$out/bench.txt" || true; } | awk -v units="$2" -v maxunits="$3" '
	function f(x) { return x >= 1000 || x <= -1000 ? sprintf("%.0f", x) : sprintf("%.4g", x) }
	function med(k, n, a, i, j, t) {
		n = cnt[k]
		for (i = 1; i <= n; i++) a[i] = val[k, i]
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	{
		name = $1; sub(/^Benchmark[^\/]*\//, "", name); sub(/-[0-9]+$/, "", name)
		if (!(name in seen)) { seen[name] = 1; order[++rows] = name }
		runs[name]++
		for (i = 3; i < NF; i += 2) { k = name SUBSEP $(i + 1); val[k, ++cnt[k]] = $i; if (!(k in mx) || $i > mx[k]) mx[k] = $i }
	}
	END {
		nu = split(units, u, " "); split(maxunits, m, " "); for (i in m) ismax[m[i]] = 1
		printf "| sub-benchmark | runs |"; for (i = 1; i <= nu; i++) printf " %s |", u[i]; print ""
		printf "|---|---|"; for (i = 1; i <= nu; i++) printf "---|"; print ""
		for (r = 1; r <= rows; r++) {
			name = order[r]; printf "| %s | %d |", name, runs[name]
			for (i = 1; i <= nu; i++) {
				k = name SUBSEP u[i]
				if (!(k in cnt)) { printf " n/a |"; continue }
				printf " %s", f(med(k))
				if (u[i] in ismax) printf " [%s]", f(mx[k])
				printf " |"
			}
			print ""
		}
	}'
}

# has NAME...: whether any of the benchmarks NAME ran.
has() {
	local n
	for n in "$@"; do grep -q "^Benchmark$n/" "$out/bench.txt" && return 0; done
	return 1
}

{
	if has Cycle Handoff; then
		echo "### dlock ÷ peer, benchstat medians (cycles/s: above 1 is dlock faster; wait and spread: dlock / peer)"
		echo
		echo "| backend / peer | W=1 cycles/s | W=16 cycles/s | W=16, a client each | contended handoffs/s | wait p50 ms | wait p99 ms | spread |"
		echo "|---|---|---|---|---|---|---|---|"
		for pair in $pairs; do ratios "${pair%%:*}" "${pair#*:}"; done
		echo
		for pair in $pairs; do
			be=${pair%%:*} peer=${pair#*:}
			echo "### backend=$be: dlock vs $peer (the peer is the base column)"
			benchstat -filter ".name:(Cycle OR Handoff) /backend:$be /lib:($peer OR dlock)" -col "/lib@($peer dlock)" "$out/bench.txt"
			echo
		done
	fi
	if has Semaphore; then
		echo "### semaphore: 16 workers, each its own client, N=4 (permits/s: medians over the passes; dlock ÷ peer per pass, median [min-max]; above 1 is dlock faster)"
		echo
		echo "| backend / peer | hold | dlock permits/s | peer permits/s | dlock ÷ peer | peak held (dlock / peer) | server ops per permit | server writes per permit | passes |"
		echo "|---|---|---|---|---|---|---|---|---|"
		semratios
		echo
		for pair in $sempairs; do
			be=${pair%%:*} peer=${pair#*:}
			echo "### semaphore, backend=$be: dlock vs $peer (the peer is the base column)"
			benchstat -filter ".name:Semaphore /backend:$be /lib:($peer OR dlock)" -col "/lib@($peer dlock)" "$out/bench.txt"
			echo
		done
	fi
	if has ScaleLeases ScaleWaiters; then
		echo "### scale workloads (dlock only; medians, [max] where a run going wrong matters)"
		echo
		scale ScaleLeases "lost acquire-errors release-errors goroutines-before goroutines-held goroutines-after cli-cpu-% rss-MB srv-ops/s srv-writes/s acquire-s" "lost acquire-errors release-errors"
		echo
		scale ScaleWaiters "cmds/acq queue-cmds/waiter drain-s conns-peak goroutines-before goroutines-peak goroutines-after errors" "errors"
		echo
		benchstat -filter '.name:(ScaleLeases OR ScaleWaiters)' "$out/bench.txt"
	fi
} | tee "$out/tables.txt"
echo "==> raw output and tables in $out" >&2
if [ "$failed" -gt 0 ]; then
	echo "==> $failed of $count passes had a failed benchmark (see $out/raw.txt)" >&2
	exit 1
fi
