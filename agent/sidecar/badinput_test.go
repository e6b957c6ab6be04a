package sidecar_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/internal/testca"
	"github.com/wasmesh/wasmesh/agent/podinfo"
	"github.com/wasmesh/wasmesh/agent/sidecar"
)

func TestBadInputFailsAtStartNamingIt(t *testing.T) {
	cases := map[string]struct {
		mutate func(o *sidecar.Options)
		want   []string
	}{
		"unparsable PROXY_CONFIG": {func(o *sidecar.Options) {
			o.Env = append(o.Env, "PROXY_CONFIG=drainDuration: [")
		}, []string{"PROXY_CONFIG"}},
		"unknown ProxyConfig field": {func(o *sidecar.Options) {
			o.Env = append(o.Env, `PROXY_CONFIG={"drainDurationz":"5s"}`)
		}, []string{"PROXY_CONFIG", "drainDurationz"}},
		"unknown interception mode annotation": {func(o *sidecar.Options) {
			writeAnnotations(t, o, map[string]string{"sidecar.istio.io/interceptionMode": "TUNNEL"})
		}, []string{"sidecar.istio.io/interceptionMode", "TUNNEL"}},
		"bad extra stat tag annotation": {func(o *sidecar.Options) {
			writeAnnotations(t, o, map[string]string{"sidecar.istio.io/extraStatTags": "tenant,bad-tag"})
		}, []string{"sidecar.istio.io/extraStatTags", "bad-tag"}},
		"bad proxy config annotation": {func(o *sidecar.Options) {
			writeAnnotations(t, o, map[string]string{"proxy.istio.io/config": "concurrency: lots"})
		}, []string{"proxy.istio.io/config"}},
		"missing binary": {func(o *sidecar.Options) {
			o.BinaryPath = filepath.Join(t.TempDir(), "envoy")
		}, []string{"--binaryPath", "envoy"}},
		"bad MINIMUM_DRAIN_DURATION": {func(o *sidecar.Options) {
			o.Env = append(o.Env, "MINIMUM_DRAIN_DURATION=five")
		}, []string{"MINIMUM_DRAIN_DURATION"}},
		"bad EXIT_ON_ZERO_ACTIVE_CONNECTIONS": {func(o *sidecar.Options) {
			o.Env = append(o.Env, "EXIT_ON_ZERO_ACTIVE_CONNECTIONS=sometimes")
		}, []string{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS"}},
		"bad WASMESH_BASE_ID": {func(o *sidecar.Options) {
			o.Env = append(o.Env, "WASMESH_BASE_ID=-3")
		}, []string{"WASMESH_BASE_ID", "-3"}},
		"bad probers": {func(o *sidecar.Options) {
			o.Env = append(o.Env, `ISTIO_KUBE_APP_PROBERS={"/app-health/web/livez":{}}`)
		}, []string{"ISTIO_KUBE_APP_PROBERS", "/app-health/web/livez"}},
		"bad prometheus annotation": {func(o *sidecar.Options) {
			writeAnnotations(t, o, map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "http"})
		}, []string{"prometheus.io/port"}},
		"missing template": {func(o *sidecar.Options) {
			o.TemplateFile = filepath.Join(t.TempDir(), "missing.tmpl")
		}, []string{"--templateFile", "missing.tmpl"}},
		"template that renders no bootstrap": {func(o *sidecar.Options) {
			p := filepath.Join(t.TempDir(), "broken.tmpl")
			require.NoError(t, os.WriteFile(p, []byte(`{"nodes": {}}`), 0o644))
			o.TemplateFile = p
		}, []string{"broken.tmpl", "nodes"}},
		"bad bootstrap override": {func(o *sidecar.Options) {
			p := filepath.Join(t.TempDir(), "override.yaml")
			require.NoError(t, os.WriteFile(p, []byte("admin: {adress: {}}"), 0o644))
			o.Env = append(o.Env, "ISTIO_BOOTSTRAP_OVERRIDE="+p)
		}, []string{"override.yaml", "adress"}},
		"malformed labels file": {func(o *sidecar.Options) {
			require.NoError(t, os.WriteFile(filepath.Join(o.PodInfoDir, "labels"), []byte("app=web\n"), 0o644))
		}, []string{"labels", "line 1"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			o, _ := options(t, pod{})
			c.mutate(&o)
			_, err := sidecar.New(o)
			require.Error(t, err)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func writeAnnotations(t *testing.T, o *sidecar.Options, a map[string]string) {
	require.NoError(t, os.WriteFile(filepath.Join(o.PodInfoDir, "annotations"), []byte(podinfo.Format(a)), 0o644))
}

// Defaults work together out of the box: with no address given, a sidecar in a pod finds
// discovery's Service on its plaintext xDS port and a sidecar elsewhere finds discovery's
// default listener on the same machine, never a cluster-only name through the host's DNS.
func TestDefaultDiscoveryAddressFollowsWhereTheAgentRuns(t *testing.T) {
	root := testca.Start(t, time.Hour).RootFile
	for _, c := range []struct {
		name, env, host string
		port            int
	}{
		{"outside Kubernetes", "", "localhost", 15012},
		{"in a pod", "KUBERNETES_SERVICE_HOST=10.96.0.1", "istiod.istio-system.svc", 15012},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The XDS proxy's TLS to discovery, the default.
			o, _ := options(t, pod{env: []string{"PROXY_CONFIG={}", "WASMESH_XDS_PLAINTEXT=false", "XDS_ROOT_CA=" + root}})
			if c.env != "" {
				o.Env = append(o.Env, c.env)
			}
			a, err := sidecar.New(o)
			require.NoError(t, err)
			assert.Equal(t, c.host, a.Params().DiscoveryHost)
			assert.Equal(t, c.port, a.Params().DiscoveryPort)
		})
	}
	// An address given in ProxyConfig is kept wherever the agent runs, the default's too.
	o, _ := options(t, pod{env: []string{`PROXY_CONFIG={"discoveryAddress":"istiod.istio-system.svc:15010"}`,
		"WASMESH_XDS_PLAINTEXT=false", "XDS_ROOT_CA=" + root}})
	a, err := sidecar.New(o)
	require.NoError(t, err)
	assert.Equal(t, "istiod.istio-system.svc", a.Params().DiscoveryHost)
}
