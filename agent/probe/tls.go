package probe

import "crypto/tls"

// insecureTLS is what the kubelet does for HTTPS probes: it does not verify the
// application's certificate.
func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} } //nolint:gosec // as the kubelet
