package localmesh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Process is one program of the mesh (discovery, an agent, an application), started in a
// process group of its own so that stopping it also stops what it started (the agent's
// proxy), with its output in a log file under the mesh's directory.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// EnvMeshDir is set in the environment of every process a mesh starts (and so of what they
// start, the agents' proxies): its value is the mesh's directory, which tells the mesh's
// processes from any other.
const EnvMeshDir = "WASMESH_MESH_DIR"

// startProcess runs bin with args and env (added to a minimal environment that names the
// mesh).
func (m *Mesh) startProcess(name, logDir, bin string, args, env []string) (*Process, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(logDir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), EnvMeshDir + "=" + m.opts.Dir}, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id (also its process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process exited (valid after Done).
func (p *Process) Err() error { return p.err }

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process only (not its group): the agent forwards what it must to
// its proxy, as in a pod.
func (p *Process) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return nil
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends SIGTERM and waits until the process exits or ctx ends, then kills its whole
// group, so nothing it started is left behind.
func (p *Process) Stop(ctx context.Context) error {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-ctx.Done():
	}
	p.Kill()
	return p.exitError()
}

// Kill ends the process group at once.
func (p *Process) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func (p *Process) exitError() error {
	var ee *exec.ExitError
	if p.err == nil || (errors.As(p.err, &ee) && ee.Exited() && ee.ExitCode() == 0) {
		return nil
	}
	return fmt.Errorf("%s: %w (log: %s)", p.Name, p.err, p.LogPath)
}

// Tail returns the last n bytes of the process's log, for error messages.
func (p *Process) Tail(n int64) string {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// waitFor polls check every 20 ms until it returns nil, ctx ends or proc exits.
func waitFor(ctx context.Context, proc *Process, what string, check func() error) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		var exited <-chan struct{}
		if proc != nil {
			exited = proc.Done()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), last)
		case <-exited:
			return fmt.Errorf("waiting for %s: %s exited: %v\n%s", what, proc.Name, proc.Err(), proc.Tail(2000))
		case <-t.C:
		}
	}
}
