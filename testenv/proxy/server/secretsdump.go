package server

import (
	"crypto/x509"
	"encoding/hex"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/wasmesh/wasmesh/testenv/proxy/tlsctx"
)

// redacted is what Envoy shows of a sensitive field (a private key) in the config dump.
const redacted = "[redacted]"

// redact replaces a TLS certificate's private key by "[redacted]", keeping the data
// source's kind, as Envoy's config dump does.
func redact(s *tlsv3.Secret) *tlsv3.Secret {
	out := proto.Clone(s).(*tlsv3.Secret)
	if tc := out.GetTlsCertificate(); tc != nil && tc.GetPrivateKey() != nil {
		switch tc.GetPrivateKey().GetSpecifier().(type) {
		case *corev3.DataSource_InlineBytes:
			tc.PrivateKey = &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte(redacted)}}
		default:
			tc.PrivateKey = &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: redacted}}
		}
	}
	return out
}

// secretsDump is Envoy's SecretsConfigDump: static secrets, SDS secrets received
// (dynamic_active_secrets) and those still awaited (dynamic_warming_secrets).
func (s *Server) secretsDump() *adminv3.SecretsConfigDump {
	d := &adminv3.SecretsConfigDump{}
	static, dynamic := s.secrets.Dump()
	for _, p := range static {
		cur := p.Current()
		d.StaticSecrets = append(d.StaticSecrets, &adminv3.SecretsConfigDump_StaticSecret{Name: p.Name,
			LastUpdated: timestamppb.New(cur.LastUpdated), Secret: mustAny(redact(cur.Proto))})
	}
	for _, p := range dynamic {
		cur := p.Current()
		if cur == nil {
			d.DynamicWarmingSecrets = append(d.DynamicWarmingSecrets, &adminv3.SecretsConfigDump_DynamicSecret{Name: p.Name})
			continue
		}
		d.DynamicActiveSecrets = append(d.DynamicActiveSecrets, &adminv3.SecretsConfigDump_DynamicSecret{Name: p.Name,
			VersionInfo: cur.Version, LastUpdated: timestamppb.New(cur.LastUpdated), Secret: mustAny(redact(cur.Proto))})
	}
	return d
}

// Certs implements admin.Backend: Envoy's /certs, one entry per TLS context of the
// active listeners and clusters, with its trusted CAs and its certificate chain.
func (s *Server) Certs() ([]byte, error) {
	var ctxs []tlsctx.Context
	if s.listeners != nil {
		for _, l := range s.listeners.Active() {
			ctxs = append(ctxs, l.TLSContexts()...)
		}
	}
	for _, c := range s.clusters.Active() {
		ctxs = append(ctxs, c.TLSContexts()...)
	}
	out := &adminv3.Certificates{}
	now := time.Now()
	for _, c := range ctxs {
		certs, validation := c.Secrets()
		e := &adminv3.Certificate{}
		if validation != nil {
			if cur := validation.Current(); cur != nil {
				for _, r := range cur.RootCerts {
					e.CaCert = append(e.CaCert, certDetails(r, cur.Validation.GetTrustedCa().GetFilename(), now))
				}
			}
		}
		for _, p := range certs {
			if cur := p.Current(); cur != nil && cur.Cert != nil {
				for _, der := range cur.Cert.Certificate {
					if x, err := x509.ParseCertificate(der); err == nil {
						e.CertChain = append(e.CertChain, certDetails(x, cur.Proto.GetTlsCertificate().GetCertificateChain().GetFilename(), now))
					}
				}
			}
		}
		out.Certificates = append(out.Certificates, e)
	}
	return protojson.MarshalOptions{Multiline: true, Indent: " ", UseProtoNames: true}.Marshal(out)
}

// certDetails is one certificate as /certs shows it; path is the file it came from
// ("<inline>" for inline data, as Envoy says).
func certDetails(c *x509.Certificate, path string, now time.Time) *adminv3.CertificateDetails {
	if path == "" {
		path = "<inline>"
	}
	d := &adminv3.CertificateDetails{Path: path, SerialNumber: hex.EncodeToString(c.SerialNumber.Bytes()),
		ValidFrom: timestamppb.New(c.NotBefore), ExpirationTime: timestamppb.New(c.NotAfter)}
	if left := c.NotAfter.Sub(now); left > 0 {
		d.DaysUntilExpiration = uint64(left / (24 * time.Hour))
	}
	for _, u := range c.URIs {
		d.SubjectAltNames = append(d.SubjectAltNames, &adminv3.SubjectAlternateName{Name: &adminv3.SubjectAlternateName_Uri{Uri: u.String()}})
	}
	for _, n := range c.DNSNames {
		d.SubjectAltNames = append(d.SubjectAltNames, &adminv3.SubjectAlternateName{Name: &adminv3.SubjectAlternateName_Dns{Dns: n}})
	}
	for _, ip := range c.IPAddresses {
		d.SubjectAltNames = append(d.SubjectAltNames, &adminv3.SubjectAlternateName{Name: &adminv3.SubjectAlternateName_IpAddress{IpAddress: ip.String()}})
	}
	return d
}
