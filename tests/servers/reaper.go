package servers

import (
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
)

// ownerLabel is the label naming the test process that started a
// container or network, by which its reaper finds them; owner is its
// value: the process id and a random token, since process ids repeat
// across containers and machines that share one Docker engine.
const ownerLabel = "dlock.test.owner"

var owner = strconv.Itoa(os.Getpid()) + "-" + rand.Text()

// The reaper: a test process that dies without Main (a crash, a timeout
// panic, SIGKILL) must leave no server running. Before the first container
// is created, the process starts a small shell child whose standard input
// is a pipe from this process that is never written: when this process
// ends, however it ends, the pipe closes, and the child removes every
// container and network labelled with this process's owner value (docker
// CLI), and nothing else. Its error output goes nowhere: after a ^C the
// test's standard error may be a closed pipe, and a write to it must not
// kill the child halfway. It
// runs in a process group of its own, so that a ^C to the test's group
// does not stop it first. (testcontainers' own reaper, Ryuk, needs an
// image that cannot be pulled here; scripts/test.sh also removes what its
// run left, by the run label, when it ends.)
var (
	reaperOnce sync.Once
	reaperIn   io.WriteCloser
	reaperCmd  *exec.Cmd
)

// reaperScript removes the containers and networks labelled with owner $1
// once its standard input ends; $0 is the docker command.
const reaperScript = `read -r _ || true
exec 2>/dev/null
f="label=` + ownerLabel + `=$1"
ids=$("$0" ps -aq --filter "$f") && [ -n "$ids" ] && "$0" rm -f -v $ids >/dev/null
nws=$("$0" network ls -q --filter "$f") && [ -n "$nws" ] && "$0" network rm $nws >/dev/null
exit 0`

// startReaper starts this process's reaper, once. Without a docker
// command it says so and leaves the clean-up after a crash to
// scripts/test.sh.
func startReaper() {
	reaperOnce.Do(func() {
		docker, err := exec.LookPath("docker")
		if err == nil {
			cmd := exec.Command("sh", "-c", reaperScript, docker, owner)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			var in io.WriteCloser
			if in, err = cmd.StdinPipe(); err == nil {
				if err = cmd.Start(); err == nil {
					reaperIn, reaperCmd = in, cmd
					return
				}
			}
		}
		fmt.Fprintf(os.Stderr, "servers: no reaper (%v): if this test process dies, its containers stay until scripts/test.sh's clean-up\n", err)
	})
}

// stopReaper ends the reaper (which then finds nothing left to remove) and
// waits for it.
func stopReaper() {
	if reaperIn == nil {
		return
	}
	_ = reaperIn.Close()
	_ = reaperCmd.Wait()
	reaperIn, reaperCmd = nil, nil
}
