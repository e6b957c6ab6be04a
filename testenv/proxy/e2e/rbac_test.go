package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbacnet "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/agent/workloadcert"
	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// rbacListenerYAML is an HTTP listener whose access log shows the response code details.
func rbacListenerYAML(name, filters string) string {
	return `
  - name: ` + name + `
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ` + name + `
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: /dev/stdout
              log_format: {text_format_source: {inline_string: "rbac-log %REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_CODE_DETAILS%\n"}}
          route_config:
            name: ` + name + `
            virtual_hosts:
            - name: ` + name + `
              domains: ["*"]
              routes:` + routeYAML("/", `{cluster: a}`) + `
          http_filters:` + filters + `
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
`
}

// The filters as the control plane generates them for an AuthorizationPolicy DENY of
// /admin and an ALLOW of GET with an x-user header or of /ip/ from 127.0.0.2, with a
// dry-run DENY of POST in the shadow rules.
const rbacHTTPFilters = `
          - name: envoy.filters.http.rbac
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC
              rules:
                action: DENY
                policies:
                  "ns[demo]-policy[deny-admin]-rule[0]":
                    permissions: [{url_path: {path: {prefix: /admin}}}]
                    principals: [{any: true}]
          - name: envoy.filters.http.rbac
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC
              rules:
                action: ALLOW
                policies:
                  "ns[demo]-policy[allow]-rule[0]":
                    permissions: [{header: {name: ":method", string_match: {exact: GET}}}]
                    principals: [{header: {name: x-user, present_match: true}}]
                  "ns[demo]-policy[allow]-rule[1]":
                    permissions: [{url_path: {path: {prefix: /ip/}}}]
                    principals: [{direct_remote_ip: {address_prefix: 127.0.0.2, prefix_len: 32}}]
              shadow_rules:
                action: DENY
                policies:
                  "ns[demo]-policy[no-post]-rule[0]":
                    permissions: [{header: {name: ":method", string_match: {exact: POST}}}]
                    principals: [{any: true}]
              shadow_rules_stat_prefix: istio_dry_run_deny_`

// clientFrom does HTTP requests from a loopback source address.
func clientFrom(t *testing.T, source string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func TestRBACHTTPFilter(t *testing.T) {
	a := newUpstream(t, "a", false, nil)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(staticCluster("a", "", addr(a)), rbacListenerYAML("authz", rbacHTTPFilters))})
	base := "http://" + p.ListenerAddr("authz")
	c, c2 := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.0.2")
	logged := func(line string) {
		t.Helper()
		p.Eventually(5*time.Second, line, func() bool { return strings.Contains(p.Stdout(), "rbac-log "+line+"\n") })
	}

	r := do(t, c, "GET", base+"/items", "", map[string]string{"x-user": "alice"})
	assert.Equal(t, 200, r.code, "allowed by rule 0")
	assert.Equal(t, "hello from a", r.body)

	r = do(t, c, "GET", base+"/items", "", nil)
	assert.Equal(t, 403, r.code, "no ALLOW policy matches")
	assert.Equal(t, "RBAC: access denied", r.body)
	logged("GET /items 403 rbac_access_denied_matched_policy[none]")

	r = do(t, c, "GET", base+"/admin/users", "", map[string]string{"x-user": "alice"})
	assert.Equal(t, 403, r.code, "the DENY filter runs first")
	logged("GET /admin/users 403 rbac_access_denied_matched_policy[ns[demo]-policy[deny-admin]-rule[0]]")

	assert.Equal(t, 403, do(t, c, "POST", base+"/items", "", map[string]string{"x-user": "alice"}).code, "POST is not allowed")
	assert.Equal(t, 403, do(t, c, "GET", base+"/ip/x", "", nil).code, "/ip/ from 127.0.0.1")
	assert.Equal(t, 200, do(t, c2, "GET", base+"/ip/x", "", nil).code, "/ip/ from 127.0.0.2")

	// Both filters count in the connection manager's rbac scope, as in Envoy: the DENY filter
	// allowed 5 requests (all but /admin) and denied 1, the ALLOW filter allowed 2 of those 5.
	assert.Equal(t, int64(5+2), p.Stat("http.authz.rbac.allowed"))
	assert.Equal(t, int64(1+3), p.Stat("http.authz.rbac.denied"))
	// The shadow DENY of POST saw the 5 requests that reached the ALLOW filter.
	assert.Equal(t, int64(1), p.Stat("http.authz.rbac.istio_dry_run_deny_shadow_denied"))
	assert.Equal(t, int64(4), p.Stat("http.authz.rbac.istio_dry_run_deny_shadow_allowed"))
}

func TestRBACNetworkFilter(t *testing.T) {
	up := echoServer(t, "echo")
	listener := `
  - name: db
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.rbac
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC
          stat_prefix: tcp.
          rules:
            action: ALLOW
            policies:
              "ns[data]-policy[from-app]-rule[0]":
                permissions: [{destination_port_range: {start: 1, end: 65536}}]
                principals: [{direct_remote_ip: {address_prefix: 127.0.0.2, prefix_len: 32}}]
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: db
          cluster: echo
`
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(staticCluster("echo", "", up), listener)})
	dial := func(source string) net.Conn {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
		conn, err := d.DialContext(context.Background(), "tcp", p.ListenerAddr("db"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
		return conn
	}

	conn := dial("127.0.0.2")
	_, err := fmt.Fprintln(conn, "hi")
	require.NoError(t, err)
	line, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "echo:hi\n", line)
	p.Eventually(5*time.Second, "the allowed connection upstream", func() bool { return p.Stat("cluster.echo.upstream_cx_total") == 1 })
	assert.Equal(t, int64(1), p.Stat("tcp.rbac.allowed"))

	denied := dial("127.0.0.1")
	_, _ = fmt.Fprintln(denied, "let me in")
	n, err := denied.Read(make([]byte, 64))
	assert.Equal(t, 0, n)
	// Closed: EOF, or a reset when the proxy closed with our bytes unread.
	require.Error(t, err, "the proxy closes a denied connection")
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "closed, not left open: %v", err)
	assert.Equal(t, int64(1), p.Stat("tcp.rbac.denied"))
	assert.Equal(t, int64(1), p.Stat("cluster.echo.upstream_cx_total"), "the denied connection never reached upstream")
	assert.Equal(t, int64(0), p.Stat("tcp.db.downstream_cx_total")-1, "tcp_proxy saw only the allowed connection")
}

// onlyFrontend is an RBAC ALLOW of the frontend's SPIFFE identity, as the control plane
// generates it for `from: [{source: {principals: [cluster.local/ns/default/sa/frontend]}}]`;
// sni, when set, is required too.
func onlyFrontend(t *testing.T, sni string) *rbacv3.RBAC {
	t.Helper()
	perm := `{"any": true}`
	if sni != "" {
		perm = `{"requestedServerName": {"exact": "` + sni + `"}}`
	}
	r := &rbacv3.RBAC{}
	require.NoError(t, protojson.Unmarshal([]byte(`{"action": "ALLOW", "policies": {"ns[default]-policy[frontend]-rule[0]": {
	  "permissions": [`+perm+`], "principals": [{"authenticated": {"principalName": {"exact": "`+spiffe("frontend")+`"}}}]}}}`), r))
	return r
}

// TestRBACWithClientCertificates: mutual TLS listeners with certificates from the agent's
// SDS; the RBAC filters read the caller's identity from its certificate.
func TestRBACWithClientCertificates(t *testing.T) {
	pk := newPKI(t)
	now := time.Now()
	frontend, other := pk.bundle(t, "frontend", now, time.Hour), pk.bundle(t, "other", now, time.Hour)
	app := newUpstream(t, "app", false, nil)
	echo := echoServer(t, "echo")
	_, sdsPath := startSDS(t, pk.bundle(t, "web", now, time.Hour))
	dtc := transportSocket(t, &tlsv3.DownstreamTlsContext{RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: meshTLS([]string{"http/1.1"})})

	httpRBAC, err := anypb.New(&rbachttp.RBAC{Rules: onlyFrontend(t, "")})
	require.NoError(t, err)
	web := httpListener(t, "web", "r-in", corev3.TrafficDirection_INBOUND,
		&hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: httpRBAC}})
	web.FilterChains[0].TransportSocket = dtc

	netRBAC, err := anypb.New(&rbacnet.RBAC{StatPrefix: "tcp.", Rules: onlyFrontend(t, "db.local")})
	require.NoError(t, err)
	proxy, err := anypb.New(&tcpv3.TcpProxy{StatPrefix: "db", ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: "echo"}})
	require.NoError(t, err)
	db := &listenerv3.Listener{Name: "db", TrafficDirection: corev3.TrafficDirection_INBOUND,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}}},
		FilterChains: []*listenerv3.FilterChain{{TransportSocket: dtc, Filters: []*listenerv3.Filter{
			{Name: "envoy.filters.network.rbac", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: netRBAC}},
			{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: proxy}}}}}}

	cp := newControlPlane(t, "")
	cp.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {edsCluster("app"), edsCluster("echo")},
		resourcev3.EndpointType: {endpoints("app", addr(app)), endpoints("echo", echo)},
		resourcev3.ListenerType: {web, db},
		resourcev3.RouteType:    {routeTo("r-in", "app")},
	})
	p := proxytest.Start(t, proxytest.Options{Bootstrap: sdsBootstrap(cp.addr, sdsPath), NoWait: true})
	p.WaitReady(20 * time.Second)

	https := func(b *workloadcert.Bundle) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{Certificates: clientCert(b), InsecureSkipVerify: true}} //nolint:gosec // a test peer
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	r := do(t, https(frontend), "GET", "https://"+p.ListenerAddr("web")+"/", "", nil)
	assert.Equal(t, 200, r.code)
	assert.Equal(t, "hello from app", r.body)
	r = do(t, https(other), "GET", "https://"+p.ListenerAddr("web")+"/", "", nil)
	assert.Equal(t, 403, r.code, "another workload's certificate")
	assert.Equal(t, "RBAC: access denied", r.body)
	assert.Equal(t, int64(1), p.Stat("http.web.rbac.allowed"))
	assert.Equal(t, int64(1), p.Stat("http.web.rbac.denied"))

	roundTrip := func(b *workloadcert.Bundle, sni string) (string, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", p.ListenerAddr("db"),
			&tls.Config{Certificates: clientCert(b), InsecureSkipVerify: true, ServerName: sni}) //nolint:gosec // a test peer
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintln(c, "q"); err != nil {
			return "", err
		}
		return bufio.NewReader(c).ReadString('\n')
	}
	got, err := roundTrip(frontend, "db.local")
	require.NoError(t, err)
	assert.Equal(t, "echo:q\n", got)
	_, err = roundTrip(other, "db.local")
	assert.Error(t, err, "another identity: closed after the handshake")
	_, err = roundTrip(frontend, "other.local")
	assert.Error(t, err, "the right identity asking for another server name")
	assert.Equal(t, int64(1), p.Stat("tcp.rbac.allowed"))
	assert.Equal(t, int64(2), p.Stat("tcp.rbac.denied"))
	assert.Equal(t, int64(1), p.Stat("cluster.echo.upstream_cx_total"), "only the allowed connection went upstream")
}
