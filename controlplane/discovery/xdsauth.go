package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/server"
)

// xdsAuth admits xDS streams on the secure port, as istiod does with XDS_AUTH and
// PILOT_ENABLE_XDS_IDENTITY_CHECK (pilot/pkg/xds/auth.go): the caller is authenticated with
// the CA's rules, and the node of its first request may claim only what the caller holds:
// its namespace, its service account, and (INSTANCE_IPS) its addresses. Refusals are counted
// in pilot_xds_auth_failures{reason}.
type xdsAuth struct {
	ca          *ca.Server
	trustDomain func() string
	// podIPs, on Kubernetes, says whether ip is the address of a pod of namespace running as
	// serviceAccount (nil without Kubernetes: only a credential's ips are held).
	podIPs   func(ip, namespace, serviceAccount string) bool
	failures *prometheus.CounterVec
	log      *slog.Logger
}

func newXDSAuth(srv *ca.Server, trustDomain func() string, podIPs func(ip, ns, sa string) bool, reg prometheus.Registerer, log *slog.Logger) (*xdsAuth, error) {
	a := &xdsAuth{ca: srv, trustDomain: trustDomain, podIPs: podIPs, log: log.With("scope", "xdsauth"),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pilot_xds_auth_failures",
			Help: "xDS streams refused on the secure port, by reason (unauthenticated: no valid credential; " +
				"permission_denied: the node claims a namespace, service account or address its caller does not hold)."}, []string{"reason"})}
	if err := reg.Register(a.failures); err != nil {
		return nil, fmt.Errorf("xDS auth metrics: %w", err)
	}
	return a, nil
}

// Authenticate implements server.Authorizer.
func (a *xdsAuth) Authenticate(ctx context.Context) (server.Caller, error) {
	c, err := a.ca.Authenticate(ctx)
	if err != nil {
		a.failures.WithLabelValues("unauthenticated").Inc()
		a.log.Warn("xDS stream not authenticated", "peer", peerAddr(ctx), "error", status.Convert(err).Message())
		return nil, err
	}
	return &xdsCaller{auth: a, caller: c, peer: peerAddr(ctx)}, nil
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// xdsCaller is an authenticated xDS client.
type xdsCaller struct {
	auth   *xdsAuth
	caller ca.Caller
	peer   string
}

func (c *xdsCaller) String() string { return c.caller.SPIFFE(c.auth.trustDomain()).String() }

// Authorize implements server.Caller.
func (c *xdsCaller) Authorize(p *model.Proxy) error {
	if err := c.check(p); err != nil {
		c.auth.failures.WithLabelValues("permission_denied").Inc()
		c.auth.log.Warn("xDS node refused", "peer", c.peer, "caller", c.String(), "node", p.ID, "error", err)
		return status.Errorf(codes.PermissionDenied, "authorization failed for %s: %v", c, err)
	}
	return nil
}

// check names the first field of the node its caller does not hold.
func (c *xdsCaller) check(p *model.Proxy) error {
	id := c.caller.Identity
	md := p.Metadata.GetFields()
	if ns := md["NAMESPACE"].GetStringValue(); ns != "" && ns != id.Namespace {
		return fmt.Errorf("node metadata NAMESPACE %q is not the caller's namespace %q", ns, id.Namespace)
	}
	if parts := strings.Split(p.ID, "~"); len(parts) == 4 {
		if _, ns, ok := strings.Cut(parts[2], "."); ok && ns != id.Namespace {
			return fmt.Errorf("node id %q names namespace %q (<pod>.<namespace>), not the caller's %q", p.ID, ns, id.Namespace)
		}
	}
	if p.Namespace != id.Namespace { // neither names one: the proxy would be configured as "default"'s
		return fmt.Errorf("the node names no namespace (node metadata NAMESPACE, node id <pod>.<namespace>); the caller's is %q", id.Namespace)
	}
	if p.ServiceAccount != "" && p.ServiceAccount != id.ServiceAccount {
		return fmt.Errorf("node metadata SERVICE_ACCOUNT %q is not the caller's service account %q", p.ServiceAccount, id.ServiceAccount)
	}
	// The addresses are INSTANCE_IPS, else the node id's (<type>~<ip>~...): either way they
	// become the workload's endpoints, so both are checked.
	field := "node metadata INSTANCE_IPS"
	if md["INSTANCE_IPS"].GetStringValue() == "" {
		field = "node id " + p.ID
	}
	for _, ip := range p.IPAddresses {
		if !c.holds(ip) {
			return fmt.Errorf("%s: %s is not an address of %s/%s (%s)", field, ip, id.Namespace, id.ServiceAccount, c.ipSource())
		}
	}
	return nil
}

// holds reports whether ip is the caller's: named by its credential, or on Kubernetes a pod's
// of its namespace running as its service account.
func (c *xdsCaller) holds(ip string) bool {
	if slices.Contains(c.caller.IPs, ip) {
		return true
	}
	return c.auth.podIPs != nil && c.auth.podIPs(ip, c.caller.Namespace, c.caller.ServiceAccount)
}

// ipSource says where the caller's addresses were looked for, for the refusal.
func (c *xdsCaller) ipSource() string {
	switch {
	case len(c.caller.IPs) > 0:
		return fmt.Sprintf("its credential names %v", c.caller.IPs)
	case c.auth.podIPs != nil:
		return "no pod of that namespace and service account has it"
	case c.caller.By == "credential":
		return "its credential names no ips"
	}
	return "a " + c.caller.By + " names no addresses and there is no Kubernetes pod registry"
}
