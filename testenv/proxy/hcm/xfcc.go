package hcm

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"net/http"
	"strings"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// SecureConn is a downstream connection that went through a TLS handshake (the
// listener's TLS transport socket).
type SecureConn interface {
	DownstreamTLS() *streaminfo.TLS
	PeerChain() []*x509.Certificate
}

const xfccHeader = "x-forwarded-client-cert"

// secureConnOf is the stream's TLS connection, nil for plaintext.
func secureConnOf(r *http.Request) SecureConn {
	tc, ok := r.Context().Value(connKey{}).(*trackedConn)
	if !ok {
		return nil
	}
	sc, _ := tc.Conn.(SecureConn)
	return sc
}

// forwardClientCert applies forward_client_cert_details to the request's
// x-forwarded-client-cert, as Envoy's connection manager does: ALWAYS_FORWARD_ONLY leaves
// it; SANITIZE (the default), and any mode on a connection without a peer certificate,
// removes it; FORWARD_ONLY leaves it; APPEND_FORWARD appends and SANITIZE_SET sets this
// hop's element (By, Hash, then set_current_client_cert_details in Envoy's order: Cert,
// Chain, Subject, URI, DNS).
func (m *Manager) forwardClientCert(r *http.Request, sc SecureConn) {
	mode := m.proto.GetForwardClientCertDetails()
	if mode == hcmv3.HttpConnectionManager_ALWAYS_FORWARD_ONLY {
		return
	}
	var t *streaminfo.TLS
	if sc != nil {
		t = sc.DownstreamTLS()
	}
	if mode == hcmv3.HttpConnectionManager_SANITIZE || t == nil || t.PeerCertificate == nil {
		r.Header.Del(xfccHeader)
		return
	}
	if mode == hcmv3.HttpConnectionManager_FORWARD_ONLY {
		return
	}
	var parts []string
	for _, u := range t.LocalURISANs {
		parts = append(parts, "By="+u)
	}
	sum := sha256.Sum256(t.PeerCertificate.Raw)
	parts = append(parts, "Hash="+hex.EncodeToString(sum[:]))
	d := m.proto.GetSetCurrentClientCertDetails()
	if d.GetCert() {
		parts = append(parts, `Cert="`+urlEncode(pemOf(t.PeerCertificate))+`"`)
	}
	if d.GetChain() {
		var b strings.Builder
		for _, c := range sc.PeerChain() {
			b.WriteString(pemOf(c))
		}
		parts = append(parts, `Chain="`+urlEncode(b.String())+`"`)
	}
	if d.GetSubject().GetValue() {
		parts = append(parts, `Subject="`+t.PeerSubject+`"`)
	}
	if d.GetUri() {
		if len(t.PeerURISANs) == 0 {
			parts = append(parts, "URI=")
		}
		for _, u := range t.PeerURISANs {
			parts = append(parts, "URI="+u)
		}
	}
	if d.GetDns() {
		for _, n := range t.PeerDNSSANs {
			parts = append(parts, "DNS="+n)
		}
	}
	elem := strings.Join(parts, ";")
	if prior := r.Header.Values(xfccHeader); mode == hcmv3.HttpConnectionManager_APPEND_FORWARD && len(prior) > 0 {
		elem = strings.Join(prior, ",") + "," + elem
	}
	r.Header.Set(xfccHeader, elem)
}

func pemOf(c *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
}

// urlEncode percent-encodes everything but unreserved characters, in lower-case hex as
// Envoy's XFCC Cert and Chain values are.
func urlEncode(s string) string {
	const hexDigits = "0123456789abcdef"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

// tlsCommand is an access log operator on the downstream or upstream connection's TLS
// ("" for plaintext, as for any value that is not there).
func tlsCommand(name string, down, up *streaminfo.TLS) string {
	t := down
	if strings.HasPrefix(name, "UPSTREAM_") {
		t = up
	}
	if t == nil {
		return ""
	}
	switch strings.TrimPrefix(strings.TrimPrefix(name, "UPSTREAM_"), "DOWNSTREAM_") {
	case "REQUESTED_SERVER_NAME":
		return t.SNI
	case "TLS_VERSION":
		return t.Version
	case "TLS_CIPHER":
		return t.Cipher
	case "PEER_URI_SAN":
		return strings.Join(t.PeerURISANs, ",")
	case "LOCAL_URI_SAN":
		return strings.Join(t.LocalURISANs, ",")
	case "PEER_SUBJECT":
		return t.PeerSubject
	case "PEER_FINGERPRINT_256":
		if t.PeerCertificate == nil {
			return ""
		}
		sum := sha256.Sum256(t.PeerCertificate.Raw)
		return hex.EncodeToString(sum[:])
	}
	return ""
}
