package e2e

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rawv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/agent/workloadcert"
	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// mtlsCluster is Istio's outbound cluster with auto mTLS: endpoints labelled tlsMode=istio
// get mutual TLS checking the server's SAN, others plaintext.
func mtlsCluster(t testing.TB, name, san string) *clusterv3.Cluster {
	t.Helper()
	c := edsCluster(name)
	utc := &tlsv3.UpstreamTlsContext{CommonTlsContext: meshTLS([]string{"istio"}, san),
		Sni: "outbound_.80_._." + name + ".default.svc.cluster.local"}
	raw, err := anypb.New(&rawv3.RawBuffer{})
	require.NoError(t, err)
	c.TransportSocketMatches = []*clusterv3.Cluster_TransportSocketMatch{
		{Name: "tlsMode-istio", Match: &structpb.Struct{Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue("istio")}},
			TransportSocket: transportSocket(t, utc)},
		{Name: "tlsMode-disabled", Match: &structpb.Struct{},
			TransportSocket: &corev3.TransportSocket{Name: "envoy.transport_sockets.raw_buffer", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: raw}}},
	}
	require.NoError(t, c.ValidateAll())
	return c
}

// meshPair is two meshproxies with certificates from one CA: "a" sends through its
// outbound listener to "b"'s inbound listeners (strict and permissive), which forward
// to an app that echoes the headers it got.
type meshPair struct {
	pki          *pki
	a, b         *proxytest.Proxy
	aCert, bCert *workloadcert.Bundle
	bSDS         interface {
		Update(*workloadcert.Bundle) error
	}
	strict, permis string // b's listener addresses
	app            *upstream
}

func newMeshPair(t *testing.T, appHandler http.HandlerFunc) *meshPair {
	t.Helper()
	mp := &meshPair{pki: newPKI(t)}
	now := time.Now()
	mp.aCert, mp.bCert = mp.pki.bundle(t, "a", now, time.Hour), mp.pki.bundle(t, "b", now, time.Hour)
	mp.app = newUpstream(t, "app", false, appHandler)
	bSDS, bPath := startSDS(t, mp.bCert)
	mp.bSDS = bSDS
	cpB := newControlPlane(t, "")
	cpB.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {edsCluster("app")},
		resourcev3.EndpointType: {endpoints("app", addr(mp.app))},
		resourcev3.ListenerType: {withAccessLog(t, inboundListener(t, "strict", "r-in", false),
			"INLOG sni=%REQUESTED_SERVER_NAME% v=%DOWNSTREAM_TLS_VERSION% peer=%DOWNSTREAM_PEER_URI_SAN% local=%DOWNSTREAM_LOCAL_URI_SAN% scheme=%REQ(:SCHEME)%"),
			inboundListener(t, "permissive", "r-in", true)},
		resourcev3.RouteType: {routeTo("r-in", "app")},
	})
	mp.b = proxytest.Start(t, proxytest.Options{Bootstrap: sdsBootstrap(cpB.addr, bPath), NoWait: true})
	mp.b.WaitReady(20 * time.Second)
	mp.strict, mp.permis = mp.b.ListenerAddr("strict"), mp.b.ListenerAddr("permissive")

	_, aPath := startSDS(t, mp.aCert)
	cpA := newControlPlane(t, "")
	cpA.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType: {mtlsCluster(t, "b", spiffe("b")), mtlsCluster(t, "b-badsan", spiffe("not-b")), edsCluster("b-plain"),
			mtlsCluster(t, "b-tcp", spiffe("b"))},
		resourcev3.EndpointType: {istioEndpoints("b", mp.strict), istioEndpoints("b-badsan", mp.strict),
			endpoints("b-plain", mp.strict), istioEndpoints("b-tcp", mp.strict)},
		resourcev3.ListenerType: {withAccessLog(t, httpListener(t, "out", "r-out", corev3.TrafficDirection_OUTBOUND),
			"OUTLOG v=%UPSTREAM_TLS_VERSION% peer=%UPSTREAM_PEER_URI_SAN% cipher=%UPSTREAM_TLS_CIPHER%"),
			httpListener(t, "badsan", "r-bad", corev3.TrafficDirection_OUTBOUND),
			httpListener(t, "plain", "r-plain", corev3.TrafficDirection_OUTBOUND), tcpListener(t, "tcp-out", "b-tcp")},
		resourcev3.RouteType: {routeTo("r-out", "b"), routeTo("r-bad", "b-badsan"), routeTo("r-plain", "b-plain")},
	})
	mp.a = proxytest.Start(t, proxytest.Options{Bootstrap: sdsBootstrap(cpA.addr, aPath), NoWait: true})
	mp.a.WaitReady(20 * time.Second)
	return mp
}

func certHash(b *workloadcert.Bundle) string {
	sum := sha256.Sum256(b.Leaf.Raw)
	return hex.EncodeToString(sum[:])
}

// dialTLS is a Go client playing a mesh peer against one of b's listeners: it reports
// whether a request over the connection got an answer.
func dialTLS(t *testing.T, addr string, certs []tls.Certificate) error {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{Certificates: certs, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // a test peer
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	buf := make([]byte, 12)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err // TLS 1.3: the server's verdict on our certificate arrives here
	}
	if !strings.HasPrefix(string(buf), "HTTP/1.1 ") {
		return io.ErrUnexpectedEOF
	}
	return nil
}

// TestMutualTLSBetweenProxies: a's outbound cluster picks TLS for endpoints labelled
// tlsMode=istio and reaches b's STRICT listener over mutual TLS with certificates served
// by the agent's SDS; b forwards the client's identity in x-forwarded-client-cert. A
// wrong SAN, plaintext to STRICT, a foreign CA, an expired certificate and no
// certificate are refused and counted; PERMISSIVE takes plaintext and TLS.
func TestMutualTLSBetweenProxies(t *testing.T) {
	mp := newMeshPair(t, nil)
	c := client(t)

	r := do(t, c, "GET", "http://"+mp.a.ListenerAddr("out")+"/", "", map[string]string{"x-forwarded-client-cert": "By=forged"})
	require.Equal(t, 200, r.code, r.body)
	assert.Equal(t, "app", r.header.Get("x-upstream"))
	// a's outbound listener sanitizes what its plaintext client sent (SANITIZE, the default).
	want := "By=" + spiffe("b") + ";Hash=" + certHash(mp.aCert) + `;Subject="";URI=` + spiffe("a")
	assert.Equal(t, want, r.header.Get("x-seen-h-X-Forwarded-Client-Cert"))
	assert.Equal(t, int64(1), mp.b.Stat("listener.strict.ssl.handshake"))
	assert.Equal(t, int64(1), mp.a.Stat("cluster.b.ssl.handshake"))
	assert.Equal(t, int64(1), mp.a.Stat("cluster.b.ssl.versions.TLSv1_2"), "Envoy's clients stop at TLS 1.2 by default")
	assert.Equal(t, int64(1), mp.b.Stat("listener.strict.ssl.versions.TLSv1_2"))
	assert.Equal(t, int64(1), mp.a.Stat("cluster.b.transport_socket_match.tlsMode-istio.total_match_count"))
	// The TLS of both connections, in the access logs.
	mp.b.Eventually(5*time.Second, "b's access log", func() bool {
		return strings.Contains(mp.b.Stdout(), "INLOG sni=outbound_.80_._.b.default.svc.cluster.local v=TLSv1.2 peer="+spiffe("a")+" local="+spiffe("b")+" scheme=https")
	})
	mp.a.Eventually(5*time.Second, "a's access log", func() bool {
		return strings.Contains(mp.a.Stdout(), "OUTLOG v=TLSv1.2 peer="+spiffe("b")+" cipher=ECDHE-ECDSA-")
	})

	// A TCP proxy to an mTLS endpoint originates TLS too.
	conn, err := net.DialTimeout("tcp", mp.a.ListenerAddr("tcp-out"), 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = io.WriteString(conn, "GET /over-tcp HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "/over-tcp", resp.Header.Get("x-seen-path"))
	assert.Contains(t, resp.Header.Get("x-seen-h-X-Forwarded-Client-Cert"), ";URI="+spiffe("a"))
	assert.Equal(t, int64(1), mp.a.Stat("cluster.b-tcp.ssl.handshake"))

	// The server's certificate names another identity than the cluster expects.
	r = do(t, c, "GET", "http://"+mp.a.ListenerAddr("badsan")+"/", "", nil)
	assert.Equal(t, 503, r.code)
	assert.Equal(t, int64(1), mp.a.Stat("cluster.b-badsan.ssl.fail_verify_san"))
	assert.GreaterOrEqual(t, mp.a.Stat("cluster.b-badsan.upstream_cx_connect_fail"), int64(1))

	// Plaintext to STRICT: no chain takes it, the connection is closed.
	r = do(t, c, "GET", "http://"+mp.a.ListenerAddr("plain")+"/", "", nil)
	assert.Equal(t, 503, r.code)
	assert.GreaterOrEqual(t, mp.b.Stat("listener.strict.no_filter_chain_match"), int64(1))

	// PERMISSIVE: plaintext goes to the plaintext chain (its XFCC is sanitized), TLS to
	// the TLS chain.
	r = do(t, c, "GET", "http://"+mp.permis+"/", "", map[string]string{"x-forwarded-client-cert": "By=forged"})
	assert.Equal(t, 200, r.code)
	assert.Equal(t, "", r.header.Get("x-seen-h-X-Forwarded-Client-Cert"))
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{
		Certificates: clientCert(mp.aCert), InsecureSkipVerify: true}}} //nolint:gosec // a test peer
	t.Cleanup(hc.CloseIdleConnections)
	r = do(t, hc, "GET", "https://"+mp.permis+"/", "", map[string]string{"x-forwarded-client-cert": "By=forged"})
	assert.Equal(t, 200, r.code)
	assert.Equal(t, int64(1), mp.b.Stat("http.permissive.downstream_rq_http2_total"), "ALPN h2: HTTP/2 over TLS")
	// APPEND_FORWARD keeps what an mTLS peer sent and appends this hop.
	assert.Equal(t, "By=forged,"+want, r.header.Get("x-seen-h-X-Forwarded-Client-Cert"))
	assert.Equal(t, int64(1), mp.b.Stat("listener.permissive.ssl.handshake"))
	assert.Equal(t, int64(1), mp.b.Stat("listener.permissive.ssl.versions.TLSv1_3"))

	// A foreign CA, an expired certificate and no certificate fail the handshake.
	foreign := newPKI(t).bundle(t, "a", time.Now(), time.Hour)
	assert.Error(t, dialTLS(t, mp.strict, clientCert(foreign)))
	expired := mp.pki.bundle(t, "a", time.Now().Add(-2*time.Hour), time.Hour)
	assert.Error(t, dialTLS(t, mp.strict, clientCert(expired)))
	assert.Equal(t, int64(2), mp.b.Stat("listener.strict.ssl.fail_verify_error"))
	assert.Error(t, dialTLS(t, mp.strict, nil))
	assert.Equal(t, int64(1), mp.b.Stat("listener.strict.ssl.fail_verify_no_cert"))
	require.NoError(t, dialTLS(t, mp.strict, clientCert(mp.aCert)), "the right certificate still gets in")
	mp.b.Eventually(5*time.Second, "three failed handshakes counted", func() bool {
		return mp.b.Stat("listener.strict.ssl.connection_error") >= 3
	})
}

// TestSecretRotationAndWarming: a listener whose certificate has not arrived warms (the
// proxy stays INITIALIZING, as Envoy's init manager waits for the SDS subscription) and
// becomes active when the agent serves it; a new certificate is taken by new handshakes
// while a request on a connection made before it completes.
func TestSecretRotationAndWarming(t *testing.T) {
	p := newPKI(t)
	app := newUpstream(t, "app", false, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(1500 * time.Millisecond)
		}
		_, _ = io.WriteString(w, "done "+r.URL.Path)
	})
	sdsServer, path := startSDS(t, nil)
	cp := newControlPlane(t, "")
	cp.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {edsCluster("app")},
		resourcev3.EndpointType: {endpoints("app", addr(app))},
		resourcev3.ListenerType: {inboundListener(t, "strict", "r-in", false)},
		resourcev3.RouteType:    {routeTo("r-in", "app")},
	})
	px := proxytest.Start(t, proxytest.Options{Bootstrap: sdsBootstrap(cp.addr, path), NoWait: true})
	px.Eventually(10*time.Second, "the listener warming for its secrets", func() bool {
		return px.Stat("listener_manager.total_listeners_warming") == 1
	})
	time.Sleep(500 * time.Millisecond)
	code, _ := px.Get("/ready")
	assert.Equal(t, 503, code, "still initializing without the certificate")
	assert.Equal(t, int64(0), px.Stat("listener_manager.total_listeners_active"))

	_, dump := px.Get("/config_dump")
	assert.Contains(t, squash(dump), `"dynamic_warming_secrets":[{"name":"ROOTCA"},{"name":"default"}]`)
	assert.NotContains(t, dump, `"dynamic_active_secrets"`)

	first := p.bundle(t, "b", time.Now(), time.Hour)
	require.NoError(t, sdsServer.Update(first))
	px.WaitReady(10 * time.Second)
	// The dump shows the secrets Envoy's way, the private key redacted.
	_, dump = px.Get("/config_dump?resource=dynamic_active_secrets")
	assert.Contains(t, squash(dump), `"name":"default"`)
	assert.Contains(t, squash(dump), `"name":"ROOTCA"`)
	assert.Contains(t, dump, base64.StdEncoding.EncodeToString([]byte("[redacted]")))
	assert.NotContains(t, dump, base64.StdEncoding.EncodeToString(first.Key)[:40])
	assert.Contains(t, dump, base64.StdEncoding.EncodeToString(first.CertChain)[:40])
	// /certs: the listener's TLS context with its CA and its certificate.
	code, certs := px.Get("/certs")
	require.Equal(t, 200, code)
	var doc struct {
		Certificates []struct {
			CACert []struct {
				SerialNumber string `json:"serial_number"`
			} `json:"ca_cert"`
			CertChain []struct {
				SerialNumber    string              `json:"serial_number"`
				SubjectAltNames []map[string]string `json:"subject_alt_names"`
				Days            string              `json:"days_until_expiration"`
			} `json:"cert_chain"`
		} `json:"certificates"`
	}
	require.NoError(t, json.Unmarshal([]byte(certs), &doc), certs)
	require.Len(t, doc.Certificates, 1)
	require.NotEmpty(t, doc.Certificates[0].CACert)
	require.NotEmpty(t, doc.Certificates[0].CertChain)
	assert.Equal(t, hex.EncodeToString(first.Leaf.SerialNumber.Bytes()), doc.Certificates[0].CertChain[0].SerialNumber)
	assert.Equal(t, []map[string]string{{"uri": spiffe("b")}}, doc.Certificates[0].CertChain[0].SubjectAltNames)
	assert.NotContains(t, px.Stderr()+px.Stdout(), "PRIVATE KEY", "secrets are never logged")
	client := p.bundle(t, "a", time.Now(), time.Hour)
	var mu sync.Mutex
	var seen []string
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: clientCert(client), InsecureSkipVerify: true, //nolint:gosec // a test peer
		VerifyConnection: func(cs tls.ConnectionState) error {
			mu.Lock()
			seen = append(seen, cs.PeerCertificates[0].SerialNumber.String())
			mu.Unlock()
			return nil
		}}}}
	t.Cleanup(hc.CloseIdleConnections)
	base := "https://" + px.ListenerAddr("strict")

	slow := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest("GET", base+"/slow", nil)
		resp, err := hc.Do(req)
		if err != nil {
			slow <- result{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		slow <- result{code: resp.StatusCode, body: string(b)}
	}()
	time.Sleep(300 * time.Millisecond) // the slow request is in flight on the first certificate
	second := p.bundle(t, "b", time.Now(), time.Hour)
	require.NoError(t, sdsServer.Update(second))
	px.Eventually(5*time.Second, "the new certificate on new connections", func() bool {
		c, err := tls.Dial("tcp", px.ListenerAddr("strict"), &tls.Config{Certificates: clientCert(client), InsecureSkipVerify: true}) //nolint:gosec // a test peer
		if err != nil {
			return false
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Cmp(second.Leaf.SerialNumber) == 0
	})
	r := do(t, hc, "GET", base+"/fast", "", nil) // the pool's connection is busy: a new one
	assert.Equal(t, "done /fast", r.body)
	s := <-slow
	assert.Equal(t, 200, s.code)
	assert.Equal(t, "done /slow", s.body, "the request on the old connection completes")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	assert.Equal(t, first.Leaf.SerialNumber.String(), seen[0])
	assert.Equal(t, second.Leaf.SerialNumber.String(), seen[1])
}

// TestClusterWarmsForSecrets: a cluster whose TLS certificate has not arrived warms even
// with its endpoints known, and becomes active when the agent serves the certificate.
func TestClusterWarmsForSecrets(t *testing.T) {
	sdsServer, path := startSDS(t, nil)
	cp := newControlPlane(t, "")
	cp.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {mtlsCluster(t, "b", spiffe("b"))},
		resourcev3.EndpointType: {istioEndpoints("b", "127.0.0.1:1")},
	})
	px := proxytest.Start(t, proxytest.Options{Bootstrap: sdsBootstrap(cp.addr, path), NoWait: true})
	px.Eventually(10*time.Second, "cluster b warming", func() bool {
		_, dump := px.Get("/config_dump?resource=dynamic_warming_clusters")
		return strings.Contains(squash(dump), `"name":"b"`)
	})
	time.Sleep(300 * time.Millisecond)
	_, dump := px.Get("/config_dump?resource=dynamic_active_clusters")
	assert.NotContains(t, squash(dump), `"name":"b"`)
	require.NoError(t, sdsServer.Update(newPKI(t).bundle(t, "a", time.Now(), time.Hour)))
	px.Eventually(10*time.Second, "cluster b active", func() bool {
		_, dump := px.Get("/config_dump?resource=dynamic_active_clusters")
		return strings.Contains(squash(dump), `"name":"b"`)
	})
}

// TestStaticSecretsFromFiles: bootstrap static secrets whose data sources are files, used
// by a static listener (tls_certificate_sds_secret_configs without sds_config) that
// requires client certificates; the dump lists them as static_secrets, the key redacted.
func TestStaticSecretsFromFiles(t *testing.T) {
	p := newPKI(t)
	srv, cli := p.bundle(t, "server", time.Now(), time.Hour), p.bundle(t, "client", time.Now(), time.Hour)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, b, 0o600))
		return path
	}
	chain, key, roots := write("chain.pem", srv.CertChain), write("key.pem", srv.Key), write("roots.pem", srv.Roots)
	boot := bootstrap(" []", `
  - name: tls
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:`+fmt.Sprintf(hcmHeader, "tls")+`
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{match: {prefix: /}, direct_response: {status: 200, body: {inline_string: "over tls"}}}]`+routerFilter+`
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            tls_certificate_sds_secret_configs: [{name: server-cert}]
            validation_context_sds_secret_config: {name: mesh-ca}
  secrets:
  - name: server-cert
    tls_certificate: {certificate_chain: {filename: `+chain+`}, private_key: {filename: `+key+`}}
  - name: mesh-ca
    validation_context: {trusted_ca: {filename: `+roots+`}}
`)
	px := proxytest.Start(t, proxytest.Options{Bootstrap: boot})
	require.NoError(t, dialTLS(t, px.ListenerAddr("tls"), clientCert(cli)))
	assert.Error(t, dialTLS(t, px.ListenerAddr("tls"), nil))
	_, dump := px.Get("/config_dump?resource=static_secrets")
	d := squash(dump)
	assert.Contains(t, d, `"name":"server-cert"`)
	assert.Contains(t, d, `"private_key":{"inline_string":"[redacted]"}`)
	assert.Contains(t, d, `"trusted_ca":{"filename":"`+roots+`"}`)
}
