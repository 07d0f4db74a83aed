package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// stopSignal is the cause that ends dlock run --elect's campaign: a signal
// to dlock.
type stopSignal struct{ sig os.Signal }

func (s *stopSignal) Error() string { return s.sig.String() }

// startFailure is the cause that ends dlock run --elect's campaign when
// the command could not be started; status is dlock's exit status.
type startFailure struct {
	err    error
	status int
}

func (f *startFailure) Error() string { return f.err.Error() }

// runElect is dlock run --elect: it campaigns for leadership of key on
// locker (a dlock.Election with eo), and runs the command (path, argv)
// each time it is elected, for as long as it leads (see runUsage). The
// first signal on sigs, or the end of ctx, ends the campaign: the command
// is stopped as a lost lease stops it, the lease is given back, and the
// status is 0. It returns the exit status.
func runElect(ctx context.Context, e *env, locker *dlock.Locker, key string, eo *dlock.ElectionOptions, path string, argv []string, grace time.Duration, sigs <-chan os.Signal) int {
	el, err := dlock.NewElection(locker, key, eo)
	if err != nil {
		// Key and holder were checked before the backend was opened: left
		// is a TTL outside the backend's limits.
		if errors.Is(err, dlock.ErrInvalidKey) || errors.Is(err, dlock.ErrInvalidTTL) || errors.Is(err, dlock.ErrInvalidConfig) {
			fmt.Fprintf(e.stderr, "dlock run: %s\nRun 'dlock run -h' for usage.\n", printable(err.Error()))
			return exitUsage
		}
		fmt.Fprintf(e.stderr, "dlock run: %s\n", printable(err.Error()))
		return exitDlockFailed
	}
	ctx, end := context.WithCancelCause(ctx)
	defer end(nil)
	go func() {
		select {
		case s := <-sigs:
			end(&stopSignal{s})
		case <-ctx.Done():
		}
	}()

	err = el.Run(ctx, func(lctx context.Context, lease *dlock.Lease) error {
		term := strconv.FormatUint(uint64(lease.Token()), 10)
		if lctx.Err() != nil {
			// The term ended before the command could start.
			fmt.Fprintf(e.stderr, "dlock run: term %s of %s ended before the command was started (%v)\n", term, key, printable(fmt.Sprint(context.Cause(lctx))))
			return nil
		}
		fmt.Fprintf(e.stderr, "dlock run: leading %s (term %s): starting the command\n", key, term)
		c, err := startChild(e, lease, path, argv, true)
		if err != nil {
			fmt.Fprintf(e.stderr, "dlock run: %v\n", err)
			end(&startFailure{err, runStartStatus(err)})
			return nil // Run gives the lease back and returns
		}
		stopped, _ := c.supervise(nil, lctx.Done(), grace, func() {
			var sig *stopSignal
			switch cause := context.Cause(lctx); {
			case errors.As(cause, &sig):
				fmt.Fprintf(e.stderr, "dlock run: %v: stopping the command (SIGTERM, SIGKILL after %v)\n", sig.sig, grace)
			case errors.Is(cause, dlock.ErrLeaseLost):
				fmt.Fprintf(e.stderr, "dlock run: lease on %s lost (%v): stopping the command (SIGTERM, SIGKILL after %v); campaigning again\n",
					key, printable(fmt.Sprint(cause)), grace)
			default:
				fmt.Fprintf(e.stderr, "dlock run: leadership of %s ended (%v): stopping the command (SIGTERM, SIGKILL after %v)\n",
					key, printable(fmt.Sprint(cause)), grace)
			}
		})
		if !stopped {
			fmt.Fprintf(e.stderr, "dlock run: the command ended (%s) in term %s: leadership of %s given up; campaigning again\n",
				c.cmd.ProcessState, term, key)
		}
		return nil
	})

	var sf *startFailure
	switch cause := context.Cause(ctx); {
	case errors.As(cause, &sf):
		return sf.status
	case ctx.Err() != nil: // a signal (or ctx): the normal end
		return exitOK
	}
	fmt.Fprintf(e.stderr, "dlock run: %s\n", printable(err.Error()))
	return exitDlockFailed
}

// defaultHolder is dlock run's holder description: "hostname/pid", within
// backend.MaxHolderLen (as dlock.ElectionOptions' default).
func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || backend.ValidateHolder(host) != nil {
		host = "unknown-host"
	}
	pid := "/" + strconv.Itoa(os.Getpid())
	if len(host)+len(pid) > backend.MaxHolderLen {
		host = host[:backend.MaxHolderLen-len(pid)]
		for len(host) > 0 && backend.ValidateHolder(host) != nil { // a cut rune
			host = host[:len(host)-1]
		}
	}
	return host + pid
}
