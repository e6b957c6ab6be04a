// Package e2e drives meshproxy as a process with real upstream servers and real clients.
package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
)

// upstream is a test upstream that names itself in the x-upstream response header and
// echoes what it received.
type upstream struct {
	name string
	srv  *httptest.Server
}

func newUpstream(t *testing.T, name string, h2c bool, handler http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{name: name}
	if handler == nil {
		handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("x-upstream", name)
			w.Header().Set("x-seen-path", r.URL.RequestURI())
			w.Header().Set("x-seen-host", r.Host)
			w.Header().Set("x-seen-proto", r.Proto)
			for k, v := range r.Header {
				w.Header().Set("x-seen-h-"+k, strings.Join(v, ","))
			}
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = fmt.Fprintf(w, "hello from %s", name)
		}
	}
	srv := httptest.NewUnstartedServer(handler)
	if h2c {
		p := new(http.Protocols)
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		srv.Config.Protocols = p
	}
	srv.Start()
	t.Cleanup(srv.Close)
	u.srv = srv
	return u
}

func (u *upstream) hostPort() (string, int) {
	a := u.srv.Listener.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

// staticCluster renders a STATIC cluster YAML block (indented for static_resources).
func staticCluster(name string, extra string, addrs ...string) string {
	var eps strings.Builder
	for _, a := range addrs {
		h, p, _ := net.SplitHostPort(a)
		fmt.Fprintf(&eps, "\n        - endpoint: {address: {socket_address: {address: %s, port_value: %s}}}", h, p)
	}
	lb := "[]"
	if len(addrs) > 0 {
		lb = eps.String()
	}
	return fmt.Sprintf(`
  - name: %q
    type: STATIC
    connect_timeout: 1s%s
    load_assignment:
      cluster_name: %q
      endpoints:
      - lb_endpoints: %s`, name, extra, name, lb)
}

func addr(u *upstream) string { return u.srv.Listener.Addr().String() }

// client does requests with a fresh HTTP/1.1 transport per test.
func client(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// h2cClient speaks HTTP/2 with prior knowledge.
func h2cClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, n, a string, _ *tls.Config) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, n, a)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

type result struct {
	code   int
	header http.Header
	body   string
}

func do(t *testing.T, c *http.Client, method, url, host string, hdr map[string]string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return result{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

const hcmHeader = `
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: %s
          access_log:
          - name: envoy.access_loggers.file
            typed_config: {"@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: /dev/stdout}`

const routerFilter = `
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}`

// refusingAddr is a loopback address that refuses connections for the whole test. A
// closed listener's port is not enough: the next listener opened (the proxy's own) may be
// given it. A bound socket that never listens holds the port and refuses.
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
