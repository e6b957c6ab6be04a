//go:build !wasip1

package main

import "time"

// rawGRPC stands in for the host's gRPC imports, which exist only in a wasip1 build;
// native tests give the VM context a grpcHost of their own.
type rawGRPC struct{}

func (rawGRPC) call([]byte, string, string, []byte, time.Duration) (uint32, error) {
	return 0, errNoGRPC
}
func (rawGRPC) cancel(uint32) error            { return errNoGRPC }
func (rawGRPC) message(uint32) ([]byte, error) { return nil, errNoGRPC }
func (rawGRPC) statusMessage() string          { return "" }
