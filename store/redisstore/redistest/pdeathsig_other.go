//go:build !linux

package redistest

import "os/exec"

// setParentDeathSignal does nothing where the kernel offers no parent-death
// signal; the servers are still stopped by the tests' cleanups.
func setParentDeathSignal(*exec.Cmd) {}
