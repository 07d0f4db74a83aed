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
