// Package envoyproc runs one proxy process per hot-restart epoch with Envoy's command
// line (docs/contracts.md), writing the epoch's bootstrap first and telling the
// supervisor when the epoch's admin reports it is live.
package envoyproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/wasmesh/wasmesh/agent/admin"
	"github.com/wasmesh/wasmesh/agent/bootstrap"
	"github.com/wasmesh/wasmesh/agent/supervisor"
)

// Config describes how to start the proxy.
type Config struct {
	BinaryPath             string
	ConfigPath             string
	DrainDuration          time.Duration
	ParentShutdownDuration time.Duration
	ServiceCluster         string
	ServiceNode            string
	LogLevel               string
	ComponentLogLevel      string
	Concurrency            int
	// BaseID is the proxy's --base-id: every proxy on one host needs its own hot-restart
	// domain; nil leaves the flag out (Envoy's default 0, right when each pod has its own
	// namespaces).
	BaseID *uint64
	// Bootstrap renders the bootstrap; it is called for every epoch so a new epoch sees
	// the current certificates and inputs.
	Bootstrap func() ([]byte, error)
	// Admin is the proxy's admin, polled after start to learn when the epoch is live.
	Admin *admin.Client
	// ReadyPoll is how often the admin is polled until the epoch is live.
	ReadyPoll time.Duration
	// Env is added to the agent's environment for the proxy process.
	Env    []string
	Stdout io.Writer
	Stderr io.Writer
	Log    *slog.Logger
}

// Proxy implements supervisor.Proxy for a process with Envoy's command line.
type Proxy struct{ c Config }

// New checks that the binary exists and is executable, so a wrong --binaryPath fails at
// start with its name rather than after the retry budget is spent.
func New(c Config) (*Proxy, error) {
	path, err := exec.LookPath(c.BinaryPath)
	if err != nil {
		return nil, fmt.Errorf("proxy binary (--binaryPath) %q: %w", c.BinaryPath, err)
	}
	c.BinaryPath = path
	if c.ReadyPoll == 0 {
		c.ReadyPoll = 100 * time.Millisecond
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	c.Log = c.Log.With("scope", "proxy")
	return &Proxy{c: c}, nil
}

// Args is the proxy's command line for an epoch, as pilot-agent builds it.
func (p *Proxy) Args(file string, epoch int) []string {
	args := []string{
		"-c", file,
		"--restart-epoch", strconv.Itoa(epoch),
		"--drain-time-s", strconv.Itoa(seconds(p.c.DrainDuration)),
		// As pilot-agent: every connection is told to close as soon as draining starts.
		"--drain-strategy", "immediate",
		"--parent-shutdown-time-s", strconv.Itoa(seconds(p.c.ParentShutdownDuration)),
		"--service-cluster", p.c.ServiceCluster,
		"--service-node", p.c.ServiceNode,
		"--local-address-ip-version", "v4",
		"--log-level", p.c.LogLevel,
	}
	if p.c.ComponentLogLevel != "" {
		args = append(args, "--component-log-level", p.c.ComponentLogLevel)
	}
	if p.c.Concurrency > 0 {
		args = append(args, "--concurrency", strconv.Itoa(p.c.Concurrency))
	}
	if p.c.BaseID != nil {
		args = append(args, "--base-id", strconv.FormatUint(*p.c.BaseID, 10))
	}
	return args
}

// seconds rounds up: Envoy takes whole seconds and a sub-second drain must not become 0.
func seconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

// Run implements supervisor.Proxy.
func (p *Proxy) Run(abort context.Context, _ string, epoch int, ready func()) error {
	data, err := p.c.Bootstrap()
	if err != nil {
		return fmt.Errorf("bootstrap for epoch %d: %w", epoch, err)
	}
	file, err := bootstrap.Write(p.c.ConfigPath, epoch, data)
	if err != nil {
		return err
	}
	args := p.Args(file, epoch)
	p.c.Log.Info("proxy command", "epoch", epoch, "binary", p.c.BinaryPath, "args", args)
	cmd := exec.Command(p.c.BinaryPath, args...)
	cmd.Stdout, cmd.Stderr = p.c.Stdout, p.c.Stderr
	if len(p.c.Env) > 0 {
		cmd.Env = append(os.Environ(), p.c.Env...)
	}
	// The proxy never outlives its agent, as Envoy dies with pilot-agent: the kernel kills
	// it when the agent goes, however the agent goes (SIGKILL, a crash, its parent's death).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.c.BinaryPath, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	watchCtx, stopWatch := context.WithCancel(abort)
	defer stopWatch()
	go p.watchReady(watchCtx, epoch, ready)

	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("epoch %d (pid %d): %w", epoch, cmd.Process.Pid, err)
		}
		return nil
	case <-abort.Done():
		p.c.Log.Warn("aborting epoch", "epoch", epoch, "pid", cmd.Process.Pid)
		if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			p.c.Log.Warn("kill failed", "epoch", epoch, "err", err)
		}
		<-done
		return supervisor.ErrAborted
	}
}

// watchReady polls /server_info until this epoch (not its parent, which holds the admin
// until the child takes it) reports LIVE.
func (p *Proxy) watchReady(ctx context.Context, epoch int, ready func()) {
	if p.c.Admin == nil {
		return
	}
	t := time.NewTicker(p.c.ReadyPoll)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		si, err := p.c.Admin.ServerInfo(rctx)
		cancel()
		if err == nil && si.State == "LIVE" && si.CommandLineOptions.RestartEpoch == epoch {
			ready()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Cleanup implements supervisor.Proxy: the epoch's bootstrap file goes with it.
func (p *Proxy) Cleanup(epoch int) {
	path := filepath.Join(p.c.ConfigPath, bootstrap.FileName(epoch))
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.c.Log.Warn("cleanup", "file", path, "err", err)
	}
}
