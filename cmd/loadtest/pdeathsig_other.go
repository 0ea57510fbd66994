//go:build !linux

package main

import "os/exec"

// setParentDeathSignal does nothing here: children notice their parent's
// death when their standard input ends.
func setParentDeathSignal(*exec.Cmd) {}
