package tlsctx

import (
	"crypto/tls"
	"fmt"
	"strings"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

// opensslNames are Envoy's (BoringSSL's) names of the TLS 1.2 cipher suites Go speaks;
// TLS 1.3 suites keep their IANA names, as in Envoy's ssl.ciphers.* stats.
var opensslNames = map[uint16]string{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256:       "ECDHE-ECDSA-AES128-GCM-SHA256",
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256:         "ECDHE-RSA-AES128-GCM-SHA256",
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384:       "ECDHE-ECDSA-AES256-GCM-SHA384",
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384:         "ECDHE-RSA-AES256-GCM-SHA384",
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: "ECDHE-ECDSA-CHACHA20-POLY1305",
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256:   "ECDHE-RSA-CHACHA20-POLY1305",
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA:          "ECDHE-ECDSA-AES128-SHA",
	tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA:            "ECDHE-RSA-AES128-SHA",
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA:          "ECDHE-ECDSA-AES256-SHA",
	tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA:            "ECDHE-RSA-AES256-SHA",
	tls.TLS_RSA_WITH_AES_128_GCM_SHA256:               "AES128-GCM-SHA256",
	tls.TLS_RSA_WITH_AES_256_GCM_SHA384:               "AES256-GCM-SHA384",
	tls.TLS_RSA_WITH_AES_128_CBC_SHA:                  "AES128-SHA",
	tls.TLS_RSA_WITH_AES_256_CBC_SHA:                  "AES256-SHA",
}

// CipherName is a cipher suite's name as Envoy's stats and access logs spell it.
func CipherName(id uint16) string {
	if n, ok := opensslNames[id]; ok {
		return n
	}
	return tls.CipherSuiteName(id)
}

// VersionName is a TLS version as Envoy names it ("TLSv1.3"); its stat form replaces the
// dot ("TLSv1_3").
func VersionName(v uint16) string {
	switch v {
	case tls.VersionTLS10:
		return "TLSv1"
	case tls.VersionTLS11:
		return "TLSv1.1"
	case tls.VersionTLS12:
		return "TLSv1.2"
	case tls.VersionTLS13:
		return "TLSv1.3"
	}
	return "unknown"
}

func protocolVersion(v tlsv3.TlsParameters_TlsProtocol, auto uint16) uint16 {
	switch v {
	case tlsv3.TlsParameters_TLSv1_0:
		return tls.VersionTLS10
	case tlsv3.TlsParameters_TLSv1_1:
		return tls.VersionTLS11
	case tlsv3.TlsParameters_TLSv1_2:
		return tls.VersionTLS12
	case tlsv3.TlsParameters_TLSv1_3:
		return tls.VersionTLS13
	}
	return auto
}

// params reads tls_params: Envoy's defaults are TLS 1.2 to 1.3 for servers and TLS 1.2
// only for clients; cipher_suites are OpenSSL names, "[a|b]" groups of equal preference
// taken in order.
func params(p *tlsv3.TlsParameters, maxAuto uint16) (minV, maxV uint16, suites []uint16, err error) {
	minV = protocolVersion(p.GetTlsMinimumProtocolVersion(), tls.VersionTLS12)
	maxV = protocolVersion(p.GetTlsMaximumProtocolVersion(), maxAuto)
	if minV > maxV {
		return 0, 0, nil, fmt.Errorf("tls_params: tls_minimum_protocol_version %s is above tls_maximum_protocol_version %s",
			p.GetTlsMinimumProtocolVersion(), p.GetTlsMaximumProtocolVersion())
	}
	byName := map[string]uint16{}
	for id, n := range opensslNames {
		byName[n] = id
	}
	for _, s := range p.GetCipherSuites() {
		for _, n := range strings.Split(strings.Trim(s, "[]"), "|") {
			id, ok := byName[n]
			if !ok {
				return 0, 0, nil, fmt.Errorf("tls_params: Failed to initialize cipher suites %s", strings.Join(p.GetCipherSuites(), ":"))
			}
			suites = append(suites, id)
		}
	}
	return minV, maxV, suites, nil
}
