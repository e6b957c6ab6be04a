package kubemesh

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// The API server refuses loopback addresses in EndpointSlices, so the mesh's pods take their
// IPs from 198.18.0.0/15 (RFC 2544's benchmarking range, never routed), made local like 127/8
// in a network namespace of the mesh's own: the program runs itself again in a new network
// namespace (a user namespace too where it may not make one alone), brings its loopback
// interface up and adds `local 198.18.0.0/15 dev lo`. Nothing on the machine changes, and
// the namespace goes with the program.
const (
	// PodNet is what kubenode.Options.PodNet gets: the first two octets of the pod IPs.
	PodNet = "198.18"
	// EnvNetns is set to "1" in the program run again inside the namespace.
	EnvNetns   = "WASMESH_KUBEMESH_NETNS"
	podNetwork = "198.18.0.0/15"
)

// InNetns reports whether this process runs in the mesh's network namespace, set up.
func InNetns() bool { return os.Getenv(EnvNetns) == "1" }

// RunInNetns runs this program again, with its arguments and standard streams, in a new
// network namespace, and returns its exit code once it has ended; in that namespace
// SetUpNetns must run first (TestMain or main checks InNetns). The child is killed with its
// parent; a SIGINT or SIGTERM this process gets is passed on to it. The error says why no namespace could be made (no privileges, no `ip`).
func RunInNetns() (int, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return 0, fmt.Errorf("the network namespace needs the ip command (iproute2): %w", err)
	}
	// The child ends the program: a signal to this process (Ctrl-C reaches both) is passed
	// on, and this process waits for the child to have stopped cleanly.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var errs []error
	for _, attr := range []*syscall.SysProcAttr{
		{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL},
		{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWUSER, Pdeathsig: syscall.SIGKILL,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}},
	} {
		cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), EnvNetns+"=1")
		cmd.SysProcAttr = attr
		if err := cmd.Start(); err != nil {
			errs = append(errs, err)
			continue
		}
		done := make(chan struct{})
		go func() {
			for {
				select {
				case sig := <-sigs:
					_ = cmd.Process.Signal(sig)
				case <-done:
					return
				}
			}
		}()
		err := cmd.Wait()
		close(done)
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return 128 + int(ws.Signal()), nil
			}
			return ee.ExitCode(), nil
		}
		return 0, err
	}
	return 0, fmt.Errorf("making a network namespace: %w", errors.Join(errs...))
}

// SetUpNetns brings the namespace's loopback up and makes the pod network local.
func SetUpNetns() error {
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"route", "add", "local", podNetwork, "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	return nil
}
