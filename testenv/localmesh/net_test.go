package localmesh

import (
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A mesh takes a pod address block no other running mesh holds, and says so when none is
// left.
func TestMeshClaimsAFreeAddressBlock(t *testing.T) {
	// A port of its own, so that meshes of test packages running beside it are unaffected.
	defer func(p int) { netClaimPort = p }(netClaimPort)
	netClaimPort = 15998
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for n := 30; n < 30+netBlocks; n++ {
		if n == 57 {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(fmt.Sprintf("127.%d.255.254", n), strconv.Itoa(netClaimPort)))
		require.NoError(t, err)
		held = append(held, l)
	}
	m := &Mesh{}
	require.NoError(t, m.claimNet())
	assert.Equal(t, byte(57), m.net)

	other := &Mesh{}
	err := other.claimNet()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no free pod address block")
	m.netClaim.Close()
	require.NoError(t, other.claimNet())
	assert.Equal(t, byte(57), other.net)
	other.netClaim.Close()
}
