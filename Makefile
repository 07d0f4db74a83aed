# dlock developer targets. `make test` is the one test command (CI runs it).

GO ?= go

# The repository is several modules (see go.work); a ./... pattern covers
# only the module of the directory it names, so targets that mean "every
# package" list every workspace module as ./dir/... (scripts/test.sh does
# the same).
PKGS = $(shell $(GO) list -m -f '{{.Dir}}/...' | sed 's|^$(CURDIR)|.|')

.PHONY: test lint bench matrix gosum proxycheck

# Run every test against real servers; scripts/test.sh provides Docker and the
# server images (stand-ins built from Debian packages where none can be pulled).
# Extra go test arguments: make test ARGS='-run TestX ./tests/redis/'
test:
	scripts/test.sh $(ARGS)

# Run the fault matrix (tests/matrix) and rewrite the README's table
# with the observed outcomes.
matrix:
	DLOCK_MATRIX_UPDATE=1 scripts/test.sh -run TestMatrix -v ./tests/matrix/

# The explorer (tests/matrix TestExplore): random operations and faults on
# every backend, checked (issue 20). `make test` runs one run per backend
# with a fresh seed; a failure prints its seed. SEED=N replays a run (the
# same random draws; timing, and so some outcomes, may differ), BACKEND=B
# chooses the backends (Redis, Redlock, etcd, ZooKeeper, comma-separated;
# default all, in parallel), BUDGET how long a run issues operations
# (default 60s), RACE=off builds without -race (on ZooKeeper the explorer
# then also draws connection resets, server kills and Close during an
# operation, which go-zookeeper's own data races keep out of a -race
# build; make test runs ZooKeeper's explorer so too):
#   make explore SEED=N BACKEND=etcd
.PHONY: explore soak
explore:
	DLOCK_EXPLORE_SEED=$(SEED) DLOCK_EXPLORE_BACKEND=$(BACKEND) DLOCK_EXPLORE_BUDGET=$(BUDGET) DLOCK_TEST_RACE=$(RACE) \
		scripts/test.sh -run TestExplore -v -timeout 0 -parallel 4 ./tests/matrix/

# Runs of the explorer with fresh seeds, one after another per backend
# (the four backends in parallel: -parallel 4, since go test runs only
# GOMAXPROCS parallel tests at once by default, and on a 2-core machine
# two backends would wait for the others' whole soak before starting
# theirs), for DURATION (default 1h); BACKEND, BUDGET and RACE as for
# explore:  make soak DURATION=1h
soak:
	DLOCK_EXPLORE_SOAK=$(or $(DURATION),1h) DLOCK_EXPLORE_BACKEND=$(BACKEND) DLOCK_EXPLORE_BUDGET=$(BUDGET) DLOCK_TEST_RACE=$(RACE) \
		scripts/test.sh -run TestExplore -v -timeout 0 -parallel 4 ./tests/matrix/

# gofmt, go vet over every module, every module's go.mod/go.sum tidy on
# its own (GOWORK=off: in the workspace a module could use a requirement
# only another module states; cmd/dlock, which requires the other modules
# at the released version with no replace directive so that go install
# PATH@VERSION works, through scripts/cmdtidy.sh against the checkout, and
# against the released modules in scripts/proxycheck.sh), two guards, and the consumer go.sum check
# (gosum, which also proves the modules resolve from a module proxy once
# released: scripts/proxycheck.sh). Guards: no module but the development
# module (tests: fault matrix, benchmarks, test servers) requires
# testcontainers-go (in its go.mod or go.sum), and no package outside
# tests/, nor its tests, depends on the test servers (tests/servers) or
# testcontainers-go: the tests that need servers live in tests/.
lint: gosum
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@for d in $$($(GO) list -m -f '{{.Dir}}'); do \
		case "$$d" in */cmd/dlock) continue ;; esac; \
		out=$$(cd "$$d" && GOWORK=off GOFLAGS=-mod=mod $(GO) mod tidy -diff 2>&1) || \
			{ echo "go.mod/go.sum of $$d not tidy (module alone, GOWORK=off):"; echo "$$out"; exit 1; }; \
	done
	@out=$$(scripts/cmdtidy.sh -diff cmd/dlock 2>&1) || \
		{ echo "go.mod/go.sum of cmd/dlock not tidy (run scripts/cmdtidy.sh):"; echo "$$out"; exit 1; }
	@bad=$$(find . -name go.mod -not -path './.git/*' -not -path './tests/*' | \
		while read -r f; do d=$$(dirname "$$f"); grep -l testcontainers-go "$$f" "$$d/go.sum" 2>/dev/null; done); \
	if [ -n "$$bad" ]; then echo "a module other than tests (the development module) requires testcontainers-go:"; echo "$$bad"; exit 1; fi
	@bad=$$($(GO) list -test -f '{{.ImportPath}}: {{join .Deps " "}}' $(PKGS) | \
		grep -v '^github.com/dlock-go/dlock/tests/' | \
		grep -E ' (github.com/dlock-go/dlock/tests/servers|github.com/testcontainers/testcontainers-go)( |$$)' | cut -d: -f1); \
	if [ -n "$$bad" ]; then echo "code or tests outside tests/ depend on tests/servers or testcontainers-go:"; echo "$$bad"; exit 1; fi

# What a user's go.sum gets from dlock: scratch consumer modules (root plus
# one backend, and the clients alone) outside the repository, getting
# dlock's modules from a file-based module proxy as released by
# scripts/release.sh (scripts/proxycheck.sh); fails if they do not resolve
# and build without replace directives, or above the go.sum limits
# (scripts/gosum.sh). Needs the Go module proxy.
gosum:
	scripts/gosum.sh

# The release check alone: release at a test version in a scratch clone,
# serve the tagged modules from a file GOPROXY, go get + build consumers.
proxycheck:
	scripts/proxycheck.sh

# Benchmarks against real servers (same setup as test), without -race.
# Extra arguments: make bench ARGS='-bench Cycle -count 10 ./tests/redis/'
bench:
	env=$$(scripts/test.sh --setup-only) && eval "$$env" && \
		$(GO) test -run '^$$' -bench . -benchmem $(or $(ARGS),$(PKGS))

# dlock beside its peers on the same servers (mutex cycles and handoffs;
# semaphore permits/s beside Redisson's and Curator's recipes), and the
# scale workloads (tests/bench, in the development module), with the
# benchstat tables.
# Knobs: COUNT (default 6), BENCHTIME (default 1s), BENCH, OUT; see
# tests/bench/run.sh.
.PHONY: peers peers-smoke
peers:
	tests/bench/run.sh

# Every benchmark of tests/bench once, the scale workloads shrunk: a check that
# the harness builds and runs (CI).
peers-smoke:
	tests/bench/run.sh --smoke

# Leader failover time (tests/failover): the leader's process killed with
# SIGKILL, then the time until the next candidate leads, for dlock's
# Election on every backend beside etcd's concurrency.Election and
# client-go's leaderelection (its lock on etcd), on the same servers with
# a lease time of 3s; RUNS runs per configuration (default 20), without
# -race, then the Markdown table (p50, p99). `make test` runs it with 2
# runs per configuration, as a smoke test that checks no figure.
.PHONY: failover
failover:
	env=$$(scripts/test.sh --setup-only) && eval "$$env" && \
		table=$$(mktemp) && trap 'rm -f "$$table"' EXIT && \
		DLOCK_FAILOVER_RUNS=$(or $(RUNS),20) DLOCK_FAILOVER_TABLE="$$table" \
		$(GO) test -count=1 -timeout 0 -v -run '^TestFailover$$' ./tests/failover/; \
	status=$$?; if [ -s "$${table:-}" ]; then echo; cat "$$table"; fi; exit $$status
