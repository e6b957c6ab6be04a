package localmesh

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TCPPeers and ProcStats.Sockets read this very process: a connection to 127.0.0.77 is
// counted under that peer while it is open, and gone once closed.
func TestTCPPeersAndSockets(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.77:0")
	require.NoError(t, err)
	defer lis.Close()
	before, err := ReadProcStats(os.Getpid())
	require.NoError(t, err)

	conn, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	served, err := lis.Accept()
	require.NoError(t, err)
	peers, err := TCPPeers(os.Getpid())
	require.NoError(t, err)
	assert.GreaterOrEqual(t, peers["127.0.0.77"], 1, "the dialed end's peer: %v", peers)
	during, err := ReadProcStats(os.Getpid())
	require.NoError(t, err)
	assert.Equal(t, before.Sockets+2, during.Sockets, "both ends are sockets")
	assert.Equal(t, before.FDs+2, during.FDs)

	conn.Close()
	served.Close()
	peers, err = TCPPeers(os.Getpid())
	require.NoError(t, err)
	assert.Zero(t, peers["127.0.0.77"], "a closed connection is no longer the process's: %v", peers)
}
