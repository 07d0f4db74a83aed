//go:build !linux

package main

import "os/exec"

// setDieWithParent reports false: outside Linux, dlock has no portable way
// to have the system kill the command when dlock dies, and the command
// outlives a killed dlock.
func setDieWithParent(*exec.Cmd) bool { return false }
