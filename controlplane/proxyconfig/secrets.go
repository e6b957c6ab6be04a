package proxyconfig

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

// Secret is one SDS secret as istioctl's secret table lists it.
type Secret struct {
	Name         string    `json:"resourceName"`
	Type         string    `json:"type,omitempty"` // "Cert Chain" or "CA"
	State        string    `json:"state"`          // ACTIVE, WARMING, UNINITIALIZED
	Valid        bool      `json:"validCert"`
	SerialNumber string    `json:"serialNumber,omitempty"`
	NotAfter     time.Time `json:"notAfter,omitzero"`
	NotBefore    time.Time `json:"notBefore,omitzero"`
}

// Secrets are the dump's SDS secrets (warming, then active) with their first certificate
// read, as istioctl reads them; now decides VALID CERT.
func (d *Dump) Secrets(now time.Time) ([]Secret, error) {
	dump, err := sectionOf[adminv3.SecretsConfigDump](d, "secrets")
	if err != nil {
		return nil, err
	}
	var out []Secret
	add := func(ds *adminv3.SecretsConfigDump_DynamicSecret, state string) error {
		if ds.GetVersionInfo() == "uninitialized" {
			state = "UNINITIALIZED"
		}
		s := Secret{Name: ds.GetName(), State: state}
		sec := &tlsv3.Secret{}
		if err := unpack(ds.GetSecret(), sec); err != nil {
			return fmt.Errorf("secret %s: %w", ds.GetName(), err)
		}
		data := sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes()
		if len(data) == 0 {
			data = sec.GetValidationContext().GetTrustedCa().GetInlineBytes()
		}
		if len(data) > 0 {
			block, _ := pem.Decode(data)
			if block == nil {
				return fmt.Errorf("secret %s: its certificate is not PEM", ds.GetName())
			}
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return fmt.Errorf("secret %s: %w", ds.GetName(), err)
			}
			s.Type = "Cert Chain"
			if cert.IsCA {
				s.Type = "CA"
			}
			s.SerialNumber = fmt.Sprintf("%032x", cert.SerialNumber)
			s.NotAfter, s.NotBefore = cert.NotAfter, cert.NotBefore
			s.Valid = now.After(cert.NotBefore) && now.Before(cert.NotAfter)
		}
		out = append(out, s)
		return nil
	}
	for _, ds := range dump.GetDynamicWarmingSecrets() {
		if err := add(ds, "WARMING"); err != nil {
			return nil, err
		}
	}
	for _, ds := range dump.GetDynamicActiveSecrets() {
		if err := add(ds, "ACTIVE"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// WriteSecrets prints istioctl's secret table: RESOURCE NAME, TYPE, STATUS, VALID CERT,
// SERIAL NUMBER, NOT AFTER, NOT BEFORE.
func WriteSecrets(w io.Writer, secrets []Secret) error {
	if len(secrets) == 0 {
		_, err := fmt.Fprintln(w, "No active or warming secrets found.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 5, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE NAME\tTYPE\tSTATUS\tVALID CERT\tSERIAL NUMBER\tNOT AFTER\tNOT BEFORE")
	for _, s := range secrets {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\t%s\n", s.Name, dash(s.Type), s.State, s.Valid, dash(s.SerialNumber),
			timeOrDash(s.NotAfter), timeOrDash(s.NotBefore))
	}
	return tw.Flush()
}

func timeOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
