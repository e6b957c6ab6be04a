package ca_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/ca"
)

// A credential names the pod's addresses when minted with them, and only addresses.
func TestCredentialIPs(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	cred, err := ca.MintCredential(key, "demo", "reviews", now.Add(time.Hour), "127.10.0.5", "fd00::5")
	require.NoError(t, err)
	c, err := ca.VerifyCredential(pub, cred, now)
	require.NoError(t, err)
	assert.Equal(t, []string{"127.10.0.5", "fd00::5"}, c.IPs)

	cred, err = ca.MintCredential(key, "demo", "reviews", now.Add(time.Hour))
	require.NoError(t, err)
	c, err = ca.VerifyCredential(pub, cred, now)
	require.NoError(t, err)
	assert.Nil(t, c.IPs, "no ips: the proxy may claim none")

	_, err = ca.MintCredential(key, "demo", "reviews", now.Add(time.Hour), "127.10.0.5", "reviews-v1")
	require.EqualError(t, err, `credential of demo/reviews: "reviews-v1" is not an IP address`)
}
