# dlock developer targets. `make test` is the one test command (CI runs it).

GO ?= go

.PHONY: test lint bench matrix

# Run every test against real servers; scripts/test.sh provides Docker and the
# server images (stand-ins built from Debian packages where none can be pulled).
# Extra go test arguments: make test ARGS='-run TestX ./redis/'
test:
	scripts/test.sh $(ARGS)

# Run the fault matrix (conformance/matrix) and rewrite the README's table
# with the observed outcomes.
matrix:
	DLOCK_MATRIX_UPDATE=1 scripts/test.sh -run TestMatrix -v ./conformance/matrix/

# gofmt, go vet, and a guard: the library's non-test code must not depend on
# the test server package (conformance/servers, testcontainers-go).
lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@bad=$$($(GO) list -f '{{.ImportPath}}: {{join .Deps " "}}' ./... | \
		grep -v '^github.com/dlock-go/dlock/conformance/servers:' | \
		grep -E ' (github.com/dlock-go/dlock/conformance/servers|github.com/testcontainers/testcontainers-go)( |$$)' | cut -d: -f1); \
	if [ -n "$$bad" ]; then echo "non-test code depends on conformance/servers or testcontainers-go:"; echo "$$bad"; exit 1; fi

# Benchmarks against real servers (same setup as test), without -race.
# Extra arguments: make bench ARGS='-bench Cycle -count 10 ./redis/'
bench:
	env=$$(scripts/test.sh --setup-only) && eval "$$env" && \
		$(GO) test -run '^$$' -bench . -benchmem $(or $(ARGS),./...)

# dlock beside its peers on the same servers, and the scale workloads
# (bench/, a module of its own), with the benchstat tables. Knobs: COUNT
# (default 6), BENCHTIME (default 1s), BENCH, OUT; see bench/run.sh.
.PHONY: peers peers-smoke
peers:
	bench/run.sh

# Every benchmark of bench/ once, the scale workloads shrunk: a check that
# the harness builds and runs (CI).
peers-smoke:
	bench/run.sh --smoke
