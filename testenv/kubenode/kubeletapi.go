package kubenode

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"time"

	vkapi "github.com/virtual-kubelet/virtual-kubelet/node/api"
)

// startKubeletAPI serves the kubelet's HTTPS API on the node's address, a port of its own
// (the Node's status.daemonEndpoints.kubeletEndpoint), for what the API server proxies to
// a kubelet: today port-forward (kubectl port-forward, client-go's portforward). Its
// certificate is self-signed: the API server, without --kubelet-certificate-authority,
// does not verify it; and it asks for no client certificate (no authentication).
func (n *Node) startKubeletAPI() error {
	cert, err := kubeletCert(n.hostIP, n.opts.Name)
	if err != nil {
		return fmt.Errorf("kubenode: kubelet certificate: %w", err)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(n.hostIP, "0"))
	if err != nil {
		return fmt.Errorf("kubenode: kubelet API: %w", err)
	}
	n.kubeletPort = int32(l.Addr().(*net.TCPAddr).Port)
	mux := http.NewServeMux()
	vkapi.AttachPodRoutes(vkapi.PodHandlerConfig{PortForward: provider{n}.PortForward}, mux, false)
	// HTTP/1.1 only: port-forward is an SPDY (or WebSocket) upgrade.
	n.kubeletAPI = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}}
	go func() { _ = n.kubeletAPI.ServeTLS(l, "", "") }()
	return nil
}

// kubeletCert is a self-signed serving certificate for the node's address and name.
func kubeletCert(ip, name string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{name},
		IPAddresses:  []net.IP{net.ParseIP(ip)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// PortForward is the kubelet's port-forward of one stream into the pod: as the kubelet
// reaches the port on the pod's own localhost, it dials the pod's private localhost (where
// 127.0.0.1 listeners are, a sidecar's admin), else the pod IP (listeners on the wildcard).
// It returns when the pod's side has closed its end, having passed on the client's close.
func (p provider) PortForward(ctx context.Context, namespace, name string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	r, err := p.get(namespace, name)
	if err != nil {
		return err
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	var conn net.Conn
	var errs []error
	for _, host := range []string{r.localhost, r.ip} {
		if conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort(host, fmt.Sprint(port))); err == nil {
			break
		}
		errs = append(errs, err)
	}
	if conn == nil {
		return fmt.Errorf("kubenode: port-forward to pod %s/%s port %d: %w", namespace, name, port, errors.Join(errs...))
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	go func() {
		_, _ = io.Copy(conn, stream)
		_ = conn.(*net.TCPConn).CloseWrite()
	}()
	if _, err := io.Copy(stream, conn); err != nil && ctx.Err() == nil {
		return fmt.Errorf("kubenode: port-forward from pod %s/%s port %d: %w", namespace, name, port, err)
	}
	return nil
}
