// Package bench compares dlock with other lock libraries in the same run.
// It is a module of its own, so that users of dlock never inherit the
// peers' dependencies. Run from this directory, with the test servers set
// up as for the main module (scripts/test.sh --setup-only prints the
// environment):
//
//	go test -run '^$' -bench . -count 6 . | tee /tmp/peers.txt
//	benchstat -col /lib /tmp/peers.txt
package bench
