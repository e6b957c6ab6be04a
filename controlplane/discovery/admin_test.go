package discovery_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/logging"
)

func request(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// Read-only pages answer GET and HEAD, and 405 to anything else, changing nothing.
func TestAdminReadOnlyPages(t *testing.T) {
	levels, err := logging.ParseLevels("default:info")
	require.NoError(t, err)
	e := start(t, map[string]string{"services.yaml": services}, func(o *discovery.Options) { o.LogLevels = levels })
	base := "http://" + e.d.HTTPAddr()
	for _, path := range []string{"/ready", "/metrics", "/debug/syncz", "/debug/configz", "/debug/registryz", "/debug/endpointz",
		"/debug/push_status", "/debug/config_dump", "/debug/leader", "/debug/nosuchpage"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			code, body := request(t, method, base+path, "")
			assert.Equal(t, http.StatusMethodNotAllowed, code, "%s %s: %s", method, path, body)
			assert.Contains(t, body, "read-only")
		}
		code, _ := request(t, http.MethodHead, base+path, "")
		assert.NotEqual(t, http.StatusMethodNotAllowed, code, "HEAD %s", path)
	}
	code, body := request(t, http.MethodGet, base+"/debug/registryz", "")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "frontend.demo.svc.cluster.local")
	code, _ = request(t, http.MethodDelete, base+"/debug/logging", "")
	assert.Equal(t, http.StatusMethodNotAllowed, code)
	_, body = request(t, http.MethodGet, base+"/debug/logging?scope=ads&level=debug", "")
	assert.NotContains(t, body, "ads:debug", "GET only reads")
}

// A state change (PUT or POST /debug/logging) is allowed from a loopback peer, or from
// elsewhere with a credential of discovery's namespace: none is 401, another namespace's 403.
func TestAdminStateChanges(t *testing.T) {
	levels, err := logging.ParseLevels("default:info")
	require.NoError(t, err)
	local := start(t, nil, func(o *discovery.Options) { o.LogLevels = levels })
	code, body := request(t, http.MethodPost, "http://"+local.d.HTTPAddr()+"/debug/logging?scope=ads&level=debug", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "ads:debug")

	ip := nonLoopbackIP(t)
	remoteLevels, err := logging.ParseLevels("default:info")
	require.NoError(t, err)
	e := startSecure(t, func(o *discovery.Options) { o.HTTPAddr = net.JoinHostPort(ip, "0"); o.LogLevels = remoteLevels })
	url := "http://" + e.d.HTTPAddr() + "/debug/logging?scope=ads&level=debug"
	for _, tc := range []struct {
		name, token string
		code        int
		says        string
	}{
		{"no credential", "", http.StatusUnauthorized, `no "Authorization: Bearer <credential>" header`},
		{"bad credential", "wasmesh1.e30.AAAA", http.StatusUnauthorized, "signature"},
		{"a workload's credential", e.credential(t, "demo", "reviews"), http.StatusForbidden, "the credential is demo/reviews's, not of namespace istio-system"},
	} {
		code, body := request(t, http.MethodPost, url, tc.token)
		assert.Equal(t, tc.code, code, "%s: %s", tc.name, body)
		assert.Contains(t, body, tc.says, tc.name)
		assert.NotContains(t, remoteLevels.String(), "ads:debug", tc.name)
		if tc.token != "" {
			assert.NotContains(t, body, tc.token, "the credential is not echoed")
		}
	}
	code, body = request(t, http.MethodPut, url, e.credential(t, "istio-system", "istiod"))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, remoteLevels.String(), "ads:debug")
}

// nonLoopbackIP is an address of this machine's that is not loopback, so that a request to
// it comes from a non-loopback peer.
func nonLoopbackIP(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && !strings.HasPrefix(n.IP.String(), "169.254.") {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address on this machine: the remote-peer rules need one")
	return ""
}
