//go:build linux

package listener

import (
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// originalDst reads SO_ORIGINAL_DST, the address an iptables REDIRECT rewrote; without
// such a rule it is the local address itself.
func originalDst(conn net.Conn) (string, bool) {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return "", false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return "", false
	}
	var out string
	_ = raw.Control(func(fd uintptr) {
		var addr syscall.RawSockaddrInet4
		size := uint32(unsafe.Sizeof(addr))
		_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.SOL_IP, unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&addr)), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			return
		}
		p := (*[2]byte)(unsafe.Pointer(&addr.Port))
		port := uint16(p[0])<<8 | uint16(p[1])
		out = netip.AddrPortFrom(netip.AddrFrom4(addr.Addr), port).String()
	})
	return out, out != ""
}
