package kubemesh_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/wasmesh/wasmesh/testenv/kubemesh"
)

// The tests run in a network namespace of their own, where the pod network is local (see
// kubemesh.RunInNetns). Where none can be made, they skip, saying why (and fail under
// WASMESH_REQUIRE_FIXTURES): the API server refuses the loopback pod IPs they would have
// otherwise.
var netnsErr error

func TestMain(m *testing.M) {
	if !kubemesh.InNetns() {
		code, err := kubemesh.RunInNetns()
		if err == nil {
			os.Exit(code)
		}
		netnsErr = err
		os.Exit(m.Run())
	}
	if err := kubemesh.SetUpNetns(); err != nil {
		fmt.Fprintf(os.Stderr, "kubemesh tests: setting up the network namespace: %v\n", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}
