package wasmfilter

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// peerCert makes a real certificate with a SPIFFE URI SAN and a DNS SAN.
func peerCert(t *testing.T) *x509.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	u, err := url.Parse("spiffe://cluster.local/ns/default/sa/productpage")
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "productpage"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), URIs: []*url.URL{u}, DNSNames: []string{"productpage.default"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}

// The connection.* attributes the telemetry filter reads for connection_security_policy,
// source_principal and destination_principal come from the downstream connection's TLS.
func TestConnectionAttributesFromTLS(t *testing.T) {
	assert.Equal(t, host.ConnectionInfo{}, connectionInfo(nil), "a plaintext connection has no TLS attribute and mtls false")

	c := peerCert(t)
	sum := sha256.Sum256(c.Raw)
	tlsInfo := &streaminfo.TLS{Version: "TLSv1.3", SNI: "outbound_.9080_._.reviews.default.svc.cluster.local",
		PeerURISANs:  []string{"spiffe://cluster.local/ns/default/sa/productpage", "spiffe://other"},
		LocalURISANs: []string{"spiffe://cluster.local/ns/default/sa/reviews"}, PeerDNSSANs: c.DNSNames,
		PeerSubject: "CN=productpage", PeerCertificate: c}
	got := connectionInfo(tlsInfo)
	assert.Equal(t, host.ConnectionInfo{MTLS: true, RequestedServerName: tlsInfo.SNI, TLSVersion: "TLSv1.3",
		URISanLocalCertificate: "spiffe://cluster.local/ns/default/sa/reviews",
		URISanPeerCertificate:  "spiffe://cluster.local/ns/default/sa/productpage",
		DNSSanPeerCertificate:  "productpage.default", SubjectPeerCertificate: "CN=productpage",
		SHA256PeerCertificateDigest: hex.EncodeToString(sum[:])}, got)

	// TLS without a client certificate is not mutual TLS.
	oneWay := &streaminfo.TLS{Version: "TLSv1.2", LocalURISANs: tlsInfo.LocalURISANs}
	got = connectionInfo(oneWay)
	assert.False(t, got.MTLS)
	assert.Empty(t, got.URISanPeerCertificate)
	assert.Empty(t, got.SHA256PeerCertificateDigest)

	var u host.UpstreamInfo
	upstreamInfo(&u, tlsInfo)
	assert.Equal(t, "spiffe://cluster.local/ns/default/sa/productpage", u.URISanPeerCertificate)
	assert.Equal(t, "spiffe://cluster.local/ns/default/sa/reviews", u.URISanLocalCertificate)
	assert.Equal(t, "TLSv1.3", u.TLSVersion)
}
