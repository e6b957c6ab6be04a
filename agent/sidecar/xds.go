package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmesh/wasmesh/agent/caclient"
	"github.com/wasmesh/wasmesh/agent/workloadcert"
	"github.com/wasmesh/wasmesh/agent/xdsproxy"
)

const (
	// XDSPlaintextEnv asks for plaintext xDS straight from the proxy to discovery, without
	// the XDS proxy: for a discovery on loopback only (tests, old local setups).
	XDSPlaintextEnv = "WASMESH_XDS_PLAINTEXT"
	// DefaultIstiodSAN is the name discovery's certificate must have unless ISTIOD_SAN says
	// otherwise (istiod's Service name, which its certificate carries).
	DefaultIstiodSAN = "istiod.istio-system.svc"
)

// discoveryConn is how the proxy and the agent's own streams reach discovery.
type discoveryConn struct {
	// proxy is the XDS proxy; nil when the proxy dials discovery itself in plaintext.
	proxy *xdsproxy.Proxy
	// dial reaches discovery for the agent's own streams (health reports).
	dial []grpc.DialOption
}

// newDiscoveryConn sets up the XDS proxy, as pilot-agent always runs it: TLS to discovery
// verified against the mesh root and ISTIOD_SAN, the workload certificate once there is
// one, and the CA credential as bearer token. Plaintext only when asked, to loopback.
func newDiscoveryConn(env map[string]string, addr string, served *workloadcert.Served,
	reg prometheus.Registerer, log *slog.Logger) (*discoveryConn, error) {
	if v := env[XDSPlaintextEnv]; v != "" {
		plain, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a boolean", XDSPlaintextEnv, v)
		}
		if plain {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, fmt.Errorf("discovery address %q: %w", addr, err)
			}
			if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
				return nil, fmt.Errorf("%s: plaintext xDS is only for a discovery on loopback, and %q is not", XDSPlaintextEnv, addr)
			}
			log.Warn("xDS in plaintext, straight from the proxy to discovery (no XDS proxy)", "discovery", addr, "asked by", XDSPlaintextEnv)
			return &discoveryConn{dial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}}, nil
		}
	}
	root, from := env["XDS_ROOT_CA"], "XDS_ROOT_CA"
	if root == "" {
		// Discovery serves xDS and the CA on one TLS port with one certificate.
		root, from = env["CA_ROOT_CA"], "CA_ROOT_CA"
	}
	if root == "" {
		root, from = DefaultCARootFile, "the default mesh root"
	}
	if _, err := caclient.LoadRoots(root); err != nil {
		return nil, fmt.Errorf("the XDS proxy verifies discovery against %s %s: %w (or set %s=true for plaintext to a discovery on loopback)",
			from, root, err, XDSPlaintextEnv)
	}
	san := istiodSAN(env)
	cfg := caclient.Config{Address: addr, RootFile: root, ServerName: san, TokenFile: caToken(env),
		ClientCertificate: served.TLSCertificate}
	dial := cfg.DialOptions()
	p, err := xdsproxy.New(xdsproxy.Config{Address: addr, DialOptions: dial, Registry: reg, Log: log})
	if err != nil {
		return nil, err
	}
	log.Info("XDS proxy to discovery", "discovery", addr, "serverName", san, "root", root, "credential", cfg.TokenFile)
	return &discoveryConn{proxy: p, dial: dial}, nil
}

// istiodSAN is the name discovery's certificate must have, for the CA and xDS alike (one
// TLS port, one certificate): ISTIOD_SAN, else istiod's Service name. Istio defaults to the
// host of the address; discovery's certificate names only its Service, so an address such
// as 127.0.0.1:15012 would never verify.
func istiodSAN(env map[string]string) string {
	if san := env["ISTIOD_SAN"]; san != "" {
		return san
	}
	return DefaultIstiodSAN
}

// serveXDS opens the XDS proxy's socket, then serves it until ctx ends; the socket exists
// when it returns, before the proxy starts.
func (a *Agent) serveXDS(ctx context.Context, spawn func(func())) error {
	l, err := xdsproxy.Listen(a.o.XDSSocket)
	if err != nil {
		return fmt.Errorf("--xdsSocket: %w", err)
	}
	spawn(func() {
		if err := a.xds.proxy.Serve(ctx, l); err != nil {
			a.log.Error("XDS proxy stopped", "err", err)
		}
	})
	a.log.Info("XDS proxy serving the proxy", "socket", a.o.XDSSocket)
	return nil
}

// XDSHelp is the part of `agent proxy sidecar`'s help about the connection to discovery.
const XDSHelp = `The proxy gets its configuration through the agent's XDS proxy (Istio's): the bootstrap's
xds-grpc cluster is a pipe to --xdsSocket, and each of the proxy's streams is forwarded
over TLS to the discovery address:
  XDS_ROOT_CA, else CA_ROOT_CA PEM roots discovery's certificate must chain to (default
                               ` + DefaultCARootFile + `)
  ISTIOD_SAN                   the name discovery's certificate must have (default
                               ` + DefaultIstiodSAN + `)
  the workload certificate, once the agent has one, as TLS client certificate, and the
  credential (` + TokenFileEnv + `, or the projected token on Kubernetes) as bearer token.
  ` + XDSPlaintextEnv + `=true       plaintext xDS straight from the proxy, no XDS proxy: only
                               for a discovery address on loopback (tests, old setups)`
