package sidecar_test

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// syscallKill0 returns nil while pid is a running (not zombie) process.
func syscallKill0(pid int) error {
	if err := syscall.Kill(pid, 0); err != nil {
		return err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return err
	}
	if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
		return fmt.Errorf("pid %d is a zombie", pid)
	}
	return nil
}
