package ca

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"
)

// A local-mesh credential: what a pod of the local mesh (no Kubernetes, so no service-account
// token) shows the CA to get a certificate of its own identity. The runner holds an Ed25519
// private key and gives each pod a credential naming that pod's namespace and service
// account; discovery holds only the public key (--localCredentialKey), so neither discovery
// nor a pod can make a credential for another identity. Format (docs/contracts.md):
//
//	wasmesh1.<base64url(payload)>.<base64url(signature)>
//
// payload: JSON {"ns": <namespace>, "sa": <service account>, "aud": "istio-ca", "exp": <unix
// seconds>, "ips": [<the pod's IP addresses>]} ("ips" optional: without it the bearer may not
// claim INSTANCE_IPS on xDS); signature: Ed25519 over the ASCII bytes "wasmesh1.<base64url(payload)>".
// base64url is RFC 4648's URL alphabet without padding. Sent as gRPC metadata
// `authorization: Bearer <credential>`, as a Kubernetes token is.
const (
	CredentialPrefix   = "wasmesh1."
	CredentialAudience = "istio-ca"
)

// Credential is what a local-mesh credential says.
type Credential struct {
	Namespace      string `json:"ns"`
	ServiceAccount string `json:"sa"`
	Audience       string `json:"aud"`
	Expiry         int64  `json:"exp"`
	// IPs are the pod's addresses: the only ones its proxy may claim (node metadata
	// INSTANCE_IPS) on xDS.
	IPs []string `json:"ips,omitempty"`
}

var b64 = base64.RawURLEncoding

// MintCredential makes the credential of a pod running as namespace/serviceAccount with the
// addresses ips (none: its proxy may claim no INSTANCE_IPS), valid until expiry.
func MintCredential(key ed25519.PrivateKey, namespace, serviceAccount string, expiry time.Time, ips ...string) (string, error) {
	if namespace == "" || serviceAccount == "" {
		return "", errors.New("a credential names a namespace and a service account")
	}
	for _, ip := range ips {
		if _, err := netip.ParseAddr(ip); err != nil {
			return "", fmt.Errorf("credential of %s/%s: %q is not an IP address", namespace, serviceAccount, ip)
		}
	}
	payload, err := json.Marshal(Credential{Namespace: namespace, ServiceAccount: serviceAccount, Audience: CredentialAudience,
		Expiry: expiry.Unix(), IPs: ips})
	if err != nil {
		return "", err
	}
	signed := CredentialPrefix + b64.EncodeToString(payload)
	return signed + "." + b64.EncodeToString(ed25519.Sign(key, []byte(signed))), nil
}

// VerifyCredential checks a credential's signature, audience and expiry and says whom it
// names.
func VerifyCredential(pub ed25519.PublicKey, cred string, now time.Time) (Credential, error) {
	var c Credential
	if !strings.HasPrefix(cred, CredentialPrefix) {
		return c, errors.New("not a wasmesh1 credential")
	}
	i := strings.LastIndexByte(cred, '.')
	if i < len(CredentialPrefix) {
		return c, errors.New("malformed credential: no signature")
	}
	sig, err := b64.DecodeString(cred[i+1:])
	if err != nil || !ed25519.Verify(pub, []byte(cred[:i]), sig) {
		return c, errors.New("credential signature does not verify with the local credential key")
	}
	payload, err := b64.DecodeString(cred[len(CredentialPrefix):i])
	if err != nil {
		return c, fmt.Errorf("malformed credential payload: %w", err)
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return c, fmt.Errorf("malformed credential payload: %w", err)
	}
	switch {
	case c.Audience != CredentialAudience:
		return c, fmt.Errorf("credential for audience %q, not %q", c.Audience, CredentialAudience)
	case c.Namespace == "" || c.ServiceAccount == "":
		return c, errors.New("credential names no namespace or service account")
	case slices.ContainsFunc(c.IPs, func(ip string) bool { _, err := netip.ParseAddr(ip); return err != nil }):
		return c, fmt.Errorf("credential of %s/%s: ips %v: not all IP addresses", c.Namespace, c.ServiceAccount, c.IPs)
	case now.Unix() >= c.Expiry:
		return c, fmt.Errorf("credential of %s/%s expired at %s", c.Namespace, c.ServiceAccount, time.Unix(c.Expiry, 0).UTC().Format(time.RFC3339))
	}
	return c, nil
}

// MarshalCredentialKey encodes the public key discovery reads (--localCredentialKey): PEM
// "PUBLIC KEY" (PKIX).
func MarshalCredentialKey(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// ReadCredentialKey reads the Ed25519 public key of a --localCredentialKey file.
func ReadCredentialKey(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("localCredentialKey: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("localCredentialKey %s: want a PEM PUBLIC KEY block", path)
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("localCredentialKey %s: %w", path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("localCredentialKey %s: a %T, want an Ed25519 public key", path, k)
	}
	return pub, nil
}
