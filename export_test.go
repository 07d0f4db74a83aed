package dlock

// HeldLen counts the leases in l's held list, for tests.
func HeldLen(l *Locker) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for le := l.held; le != nil; le = le.next {
		n++
	}
	return n
}

// LineLen counts the waiters in l's line for key, for tests.
func LineLen(l *Locker, key string) int {
	l.lineMu.Lock()
	defer l.lineMu.Unlock()
	if ln := l.lines[key]; ln != nil {
		return ln.waiters.Len()
	}
	return 0
}

// LeaseContexts counts the contexts made by le.Context that its end is to
// cancel, for tests.
func LeaseContexts(le *Lease) int {
	le.mu.Lock()
	defer le.mu.Unlock()
	return len(le.onEnd)
}

// Values the tests check, unexported in the package.
const (
	FailedAttempts     = failedAttempts
	DefaultDriftFactor = defaultDriftFactor
	MinTTL             = minTTL
	DefaultTTL         = defaultTTL
)

// CheckPurpose is Purpose.check, for tests.
func CheckPurpose(p Purpose, g Guarantees) error { return p.check(g) }
