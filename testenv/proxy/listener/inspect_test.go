package listener

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func loopback(t *testing.T) (server, client net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer lis.Close()
	client, err = net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	server, err = lis.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, client
}

// The inspector reads a ClientHello's SNI and ALPN without answering it, and what it
// read is replayed: the handshake that follows sees the whole ClientHello.
func TestPeekHelloTLS(t *testing.T) {
	server, client := loopback(t)
	hs := make(chan error, 1)
	go func() {
		hs <- tls.Client(client, &tls.Config{ServerName: "svc.example", NextProtos: []string{"istio", "h2"}, InsecureSkipVerify: true}).Handshake() //nolint:gosec // test
	}()
	conn, h, timedOut := peekHello(server, 5*time.Second)
	require.False(t, timedOut)
	assert.True(t, h.tls)
	assert.Equal(t, "svc.example", h.sni)
	assert.Equal(t, []string{"istio", "h2"}, h.alpn)
	// The replayed bytes start with the TLS handshake record.
	b := make([]byte, 3)
	_, err := io.ReadFull(conn, b)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x16, 0x03, 0x01}, b)
	select {
	case err := <-hs:
		t.Fatalf("the client heard from the inspector (%v): peeking must not answer", err)
	case <-time.After(200 * time.Millisecond):
	}
}

// Plaintext is raw_buffer and reaches the chain byte for byte; nothing is written back.
func TestPeekHelloPlaintextAndTimeout(t *testing.T) {
	server, client := loopback(t)
	_, err := io.WriteString(client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	conn, h, timedOut := peekHello(server, 5*time.Second)
	assert.False(t, timedOut)
	assert.False(t, h.tls)
	got := make([]byte, len("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	_, err = io.ReadFull(conn, got)
	require.NoError(t, err)
	assert.Equal(t, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", string(got))
	_ = client.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	n, _ := client.Read(make([]byte, 16))
	assert.Equal(t, 0, n, "the inspector sent nothing (no TLS alert) to a plaintext client")

	// A client that sends nothing: the listener filter timeout.
	quiet, _ := loopback(t)
	start := time.Now()
	_, h, timedOut = peekHello(quiet, 200*time.Millisecond)
	assert.True(t, timedOut)
	assert.False(t, h.tls)
	assert.Less(t, time.Since(start), 2*time.Second)
}
