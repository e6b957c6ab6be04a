//go:build unix

package wasmtest

import "syscall"

// cpuTime is the CPU time (user and system) the process has used, in nanoseconds; on a
// shared machine it moves less with other processes' load than the wall clock does.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
