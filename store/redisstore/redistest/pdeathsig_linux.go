package redistest

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel SIGKILL the server if the test binary
// dies without running its cleanups (a panic, a -timeout kill), so no
// redis-server outlives its test.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
