//go:build !linux

package server

import (
	"errors"
	"net"
	"time"
)

// setUserTimeout: TCP_USER_TIMEOUT is Linux's.
func setUserTimeout(*net.TCPConn, time.Duration) error {
	return errors.New("TCP_USER_TIMEOUT is not available on this platform")
}
