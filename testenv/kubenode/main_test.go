package kubenode_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// The API server refuses loopback addresses in EndpointSlices, so the pods of these tests
// take their IPs from 198.18.0.0/15 (RFC 2544's benchmarking range, never routed), which
// the tests make local like 127/8 in a network namespace of their own: the test binary
// runs itself again in a new network namespace, brings its loopback interface up and adds
// `local 198.18.0.0/15 dev lo`. Nothing on the machine changes, and the namespace goes
// with the tests. Where no namespace can be made, the tests run in the machine's network
// with loopback pod IPs, and the EndpointSlice check is skipped (it fails under
// WASMESH_REQUIRE_FIXTURES).
const (
	envInNetns = "KUBENODE_TEST_NETNS"
	podNetwork = "198.18.0.0/15"
)

func TestMain(m *testing.M) {
	if kubeconfig := os.Getenv(envChildNode); kubeconfig != "" {
		runChildNode(kubeconfig) // never returns
	}
	switch os.Getenv(envInNetns) {
	case "":
		code, err := runInNetns()
		if err == nil {
			os.Exit(code)
		}
		fmt.Fprintf(os.Stderr, "kubenode tests: running in the machine's network (%v)\n", err)
		os.Setenv(envInNetns, "none")
	case "1":
		if err := setUpNetns(); err != nil {
			fmt.Fprintf(os.Stderr, "kubenode tests: setting up the network namespace: %v\n", err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// runInNetns runs the test binary again in a new network namespace (a user namespace too
// when the process may not make one alone) and returns its exit code.
func runInNetns() (int, error) {
	var errs []error
	for _, attr := range []*syscall.SysProcAttr{
		{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL},
		{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWUSER, Pdeathsig: syscall.SIGKILL,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}},
	} {
		cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), envInNetns+"=1")
		cmd.SysProcAttr = attr
		err := cmd.Start()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), nil
		}
		return 0, err
	}
	return 0, errors.Join(errs...)
}

func setUpNetns() error {
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"route", "add", "local", podNetwork, "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	return nil
}

// inNetns reports whether the tests run in their own network namespace, where pods may
// have IPs an EndpointSlice takes.
func inNetns() bool { return os.Getenv(envInNetns) == "1" }
