package kubenode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// EnvNodeDir is set in the environment of every process a node starts (containers, exec
// hooks and probes), and so of what they start: its value is the node's directory, which
// tells the node's processes from any other (Node.Processes).
const EnvNodeDir = "WASMESH_KUBENODE_DIR"

// process is one run of a container's command: a process group of its own that dies with
// the node (parent-death SIGKILL), its output appended to a log file.
type process struct {
	cmd      *exec.Cmd
	pid      int
	started  time.Time
	done     chan struct{}
	finished time.Time
	err      error
}

func startProcess(argv, env []string, dir, logPath string) (*process, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, started: time.Now(), done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		// What the container left behind goes with it, as with a container's PID
		// namespace: its whole process group.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		logf.Close()
		p.err, p.finished = err, time.Now()
		close(p.done)
	}()
	return p, nil
}

func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the container's main process only, as a container runtime does.
func (p *process) signal(sig syscall.Signal) {
	if p.running() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// kill ends the whole process group at once and waits for the process.
func (p *process) kill() {
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	<-p.done
}

// exit is how the process ended, as a container's terminated state says it: the exit code
// (128+signal for a signal, as container runtimes report it) and the reason.
func (p *process) exit() (code int32, signal int32) {
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		if p.err != nil {
			return 128, 0
		}
		return 0, 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal()), int32(ws.Signal())
	}
	return int32(ee.ExitCode()), 0
}

// runExec runs an exec hook or probe inside a container (its environment and working
// directory) until it exits or ctx ends, and returns its output (the first 10 KiB) and
// error; a process still running when ctx ends is killed with its group.
func runExec(ctx context.Context, argv, env []string, dir string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, dir
	var out limitedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if ctx.Err() != nil && err != nil {
		err = fmt.Errorf("command %q timed out: %w", strings.Join(argv, " "), ctx.Err())
	}
	return out.Bytes(), err
}

type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := 10<<10 - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// processesMarked lists the processes whose environment has name=value.
func processesMarked(name, value string) []int {
	entries, _ := os.ReadDir("/proc")
	want := []byte(name + "=" + value + "\x00")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		if bytes.HasPrefix(b, want) || bytes.Contains(b, append([]byte{0}, want...)) {
			pids = append(pids, pid)
		}
	}
	return pids
}
