package kubenode_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/wasmesh/wasmesh/testenv/kubemesh"
)

// The API server refuses loopback addresses in EndpointSlices, so the pods of these tests
// take their IPs from kubemesh.PodNet (198.18.0.0/15, RFC 2544's benchmarking range, never
// routed), which the tests make local like 127/8 in a network namespace of their own
// (kubemesh.RunInNetns: the test binary runs itself again there). Nothing on the machine
// changes, and the namespace goes with the tests. Where no namespace can be made, the tests
// run in the machine's network with loopback pod IPs, and the EndpointSlice check is
// skipped (it fails under WASMESH_REQUIRE_FIXTURES).
func TestMain(m *testing.M) {
	if kubeconfig := os.Getenv(envChildNode); kubeconfig != "" {
		runChildNode(kubeconfig) // never returns
	}
	if kubemesh.InNetns() {
		if err := kubemesh.SetUpNetns(); err != nil {
			fmt.Fprintf(os.Stderr, "kubenode tests: setting up the network namespace: %v\n", err)
			os.Exit(2)
		}
		os.Exit(m.Run())
	}
	code, err := kubemesh.RunInNetns()
	if err == nil {
		os.Exit(code)
	}
	fmt.Fprintf(os.Stderr, "kubenode tests: running in the machine's network (%v)\n", err)
	os.Exit(m.Run())
}

// inNetns reports whether the tests run in their own network namespace, where pods may
// have IPs an EndpointSlice takes.
func inNetns() bool { return kubemesh.InNetns() }
