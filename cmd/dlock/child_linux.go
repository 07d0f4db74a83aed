//go:build linux

package main

import (
	"os/exec"
	"syscall"
)

// setDieWithParent has the kernel kill cmd's process (SIGKILL) when dlock
// dies before it: the parent-death signal (prctl PR_SET_PDEATHSIG), which
// the kernel sends when the thread that started the process ends (see
// startChild). It reports true: it is done on Linux.
func setDieWithParent(cmd *exec.Cmd) bool {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return true
}
