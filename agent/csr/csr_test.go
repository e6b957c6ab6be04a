package csr

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRequestNamesTheIdentityWithTheKeyAsked(t *testing.T) {
	id, err := SPIFFEID("cluster.local", "default", "bookinfo-reviews")
	require.NoError(t, err)
	assert.Equal(t, "spiffe://cluster.local/ns/default/sa/bookinfo-reviews", id.String())
	for _, tc := range []struct {
		kind KeyType
		alg  x509.PublicKeyAlgorithm
	}{{ECDSA, x509.ECDSA}, {RSA, x509.RSA}} {
		t.Run(string(tc.kind), func(t *testing.T) {
			r, err := New(tc.kind, id)
			require.NoError(t, err)
			parsed, err := Parse(r.CSR)
			require.NoError(t, err)
			require.Len(t, parsed.URIs, 1)
			assert.Equal(t, id.String(), parsed.URIs[0].String())
			assert.Empty(t, parsed.DNSNames)
			assert.Equal(t, tc.alg, parsed.PublicKeyAlgorithm)
			switch k := parsed.PublicKey.(type) {
			case *ecdsa.PublicKey:
				assert.Equal(t, elliptic.P256(), k.Curve)
			case *rsa.PublicKey:
				assert.Equal(t, RSABits, k.N.BitLen())
			}
			// The PEM key is the CSR's key.
			b, _ := pem.Decode(r.Key)
			require.NotNil(t, b)
			key, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			require.NoError(t, err)
			pub, err := x509.MarshalPKIXPublicKey(key.(crypto.Signer).Public())
			require.NoError(t, err)
			csrPub, err := x509.MarshalPKIXPublicKey(parsed.PublicKey)
			require.NoError(t, err)
			assert.Equal(t, csrPub, pub)
		})
	}
}

func TestBadInputIsNamed(t *testing.T) {
	_, err := ParseKeyType("DSA")
	assert.ErrorContains(t, err, `key type "DSA"`)
	for in, want := range map[string]KeyType{"": ECDSA, "ecdsa": ECDSA, "RSA": RSA} {
		got, err := ParseKeyType(in)
		require.NoError(t, err)
		assert.Equal(t, want, got, in)
	}
	_, err = SPIFFEID("cluster.local", "", "sa")
	assert.ErrorContains(t, err, `namespace ""`)
	_, err = SPIFFEID("cluster.local", "ns", "a/b")
	assert.ErrorContains(t, err, `service account "a/b"`)
	_, err = Parse([]byte("not pem"))
	assert.ErrorContains(t, err, "no PEM CERTIFICATE REQUEST")
}

// BenchmarkKeyAndCSR is the agent's cost of a rotation before the CA is asked: a new key
// and a CSR, per key type.
func BenchmarkKeyAndCSR(b *testing.B) {
	id, err := SPIFFEID("cluster.local", "default", "bench")
	require.NoError(b, err)
	for _, kind := range []KeyType{ECDSA, RSA} {
		b.Run(string(kind), func(b *testing.B) {
			for b.Loop() {
				if _, err := New(kind, id); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "csr/s")
		})
	}
}
