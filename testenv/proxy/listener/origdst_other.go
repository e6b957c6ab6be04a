//go:build !linux

package listener

import "net"

// originalDst is unavailable off Linux: connections stay on the listener that accepted them.
func originalDst(net.Conn) (string, bool) { return "", false }
