package bootstrap

import (
	"bufio"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/wasmesh/wasmesh/agent/podinfo"
	"github.com/wasmesh/wasmesh/agent/proxyconfig"
)

var update = flag.Bool("update", false, "rewrite the golden envoy-rev0.json files")

// readEnv reads a case's env file: KEY=value per line, the value taken literally.
func readEnv(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var env []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := sc.Text(); strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#") {
			env = append(env, line)
		}
	}
	require.NoError(t, sc.Err())
	return env
}

// renderCase builds a bootstrap the way the agent does: env, pod info files,
// ProxyConfig layers, the case's template and override when present.
func renderCase(t *testing.T, dir string) ([]byte, error) {
	t.Helper()
	env := readEnv(t, filepath.Join(dir, "env"))
	pod, err := podinfo.Read(dir)
	require.NoError(t, err)
	in := InputFromEnv(env)
	in.Labels, in.Annotations = pod.Labels, pod.Annotations
	in.Version = "test"
	// The agent serves SDS when it has a certificate source (package sidecar).
	if b, err := os.ReadFile(filepath.Join(dir, "sds-socket")); err == nil {
		in.SDSSocketPath = strings.TrimSpace(string(b))
	}
	// The agent runs the XDS proxy unless plaintext to a loopback discovery was asked for.
	if b, err := os.ReadFile(filepath.Join(dir, "xds-socket")); err == nil {
		in.XDSSocketPath = strings.TrimSpace(string(b))
	}
	envs := EnvMap(env)
	pc, err := proxyconfig.Effective(proxyconfig.Layers{Env: envs["PROXY_CONFIG"], Annotations: pod.Annotations})
	if err != nil {
		return nil, err
	}
	in.ProxyConfig = pc
	p, err := NewParams(in)
	if err != nil {
		return nil, err
	}
	tmpl := DefaultTemplate()
	if _, err := os.Stat(filepath.Join(dir, "template.tmpl")); err == nil {
		tmpl, err = LoadTemplate(filepath.Join(dir, "template.tmpl"))
		require.NoError(t, err)
	}
	var override []byte
	if o := envs["ISTIO_BOOTSTRAP_OVERRIDE"]; o != "" {
		override, err = os.ReadFile(filepath.Join(dir, o))
		require.NoError(t, err)
	}
	return tmpl.Render(p, override, envs["ISTIO_BOOTSTRAP_OVERRIDE"])
}

func TestGolden(t *testing.T) {
	cases, err := os.ReadDir("testdata")
	require.NoError(t, err)
	require.NotEmpty(t, cases)
	for _, c := range cases {
		if !c.IsDir() || c.Name() == "fuzz" { // testdata/fuzz holds FuzzAgentEnv's corpus
			continue
		}
		t.Run(c.Name(), func(t *testing.T) {
			dir := filepath.Join("testdata", c.Name())
			got, err := renderCase(t, dir)
			require.NoError(t, err)

			b := &bootstrapv3.Bootstrap{}
			require.NoError(t, protojson.Unmarshal(got, b), "the written file parses as a v3 bootstrap")
			require.NoError(t, b.ValidateAll())

			golden := filepath.Join(dir, "envoy-rev0.json")
			if *update {
				require.NoError(t, os.WriteFile(golden, got, 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test -update to create the golden file")
			assert.Equal(t, string(want), string(got))
		})
	}
}

// TestAnnotationReachesStatsTags checks the annotation → stats_tags path on its own: the
// tag a pod asks for gets the rule that cuts name=.=value;.; out of a metric name.
func TestAnnotationReachesStatsTags(t *testing.T) {
	tags, err := StatsTags(map[string]string{AnnotationExtraStatTags: "tenant, request_method"},
		proxyconfigWithTags("upstream_peer"))
	require.NoError(t, err)
	byName := map[string]string{}
	for _, tag := range tags {
		_, dup := byName[tag.TagName]
		require.False(t, dup, "tag %s appears twice", tag.TagName)
		byName[tag.TagName] = tag.Regex
	}
	assert.Equal(t, `(tenant=\.=(.*?);\.;)`, byName["tenant"])
	assert.Equal(t, `(request_method=\.=(.*?);\.;)`, byName["request_method"])
	assert.Equal(t, `(upstream_peer=\.=(.*?);\.;)`, byName["upstream_peer"])
	assert.Equal(t, `(reporter=\.=(.*?);\.;)`, byName["reporter"])
	assert.Contains(t, byName["response_code"], `response_code=\.=`)
}

func TestBadInputNamesIt(t *testing.T) {
	base := func() Input {
		return Input{PodName: "p", PodNamespace: "ns", InstanceIP: "10.0.0.1", ProxyConfig: proxyconfig.Default()}
	}
	cases := map[string]struct {
		mutate func(*Input)
		want   string
	}{
		"bad extra tag": {func(in *Input) {
			in.Annotations = map[string]string{AnnotationExtraStatTags: "ok,not-a-tag"}
		}, AnnotationExtraStatTags},
		"unknown interception mode": {func(in *Input) {
			in.Annotations = map[string]string{AnnotationInterceptionMode: "MAGIC"}
		}, AnnotationInterceptionMode},
		"bad inclusion regexp": {func(in *Input) {
			in.Annotations = map[string]string{AnnotationStatsInclusionRegexps: "http\\.(unclosed"}
		}, AnnotationStatsInclusionRegexps},
		"bad pod ports": {func(in *Input) {
			in.Env = []string{"ISTIO_META_POD_PORTS=8080"}
		}, "ISTIO_META_POD_PORTS"},
		"bad localhost": {func(in *Input) { in.Localhost = "localhost" }, "WASMESH_LOCALHOST"},
		"bad delta switch": {func(in *Input) {
			in.Env = []string{"ISTIO_DELTA_XDS=sometimes"}
		}, "ISTIO_DELTA_XDS"},
		"bad discovery address": {func(in *Input) {
			in.ProxyConfig.DiscoveryAddress = "istiod"
		}, "discovery address"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			in := base()
			c.mutate(&in)
			_, err := NewParams(in)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestBadTemplateAndOverride(t *testing.T) {
	p, err := NewParams(Input{PodName: "p", PodNamespace: "ns", InstanceIP: "10.0.0.1", ProxyConfig: proxyconfig.Default()})
	require.NoError(t, err)

	tmpl, err := ParseTemplate("mine.tmpl", `{"node": {"id": {{ json .NodeID }}}, "admn": {}}`)
	require.NoError(t, err)
	_, err = tmpl.Render(p, nil, "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "mine.tmpl")
	assert.Contains(t, err.Error(), "admn")

	_, err = DefaultTemplate().Render(p, []byte("static_resources: {clusters: [{name: x, connect_timeout: -1s}]}"), "/etc/override.yaml")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid")

	_, err = DefaultTemplate().Render(p, []byte("nodes: {}"), "/etc/override.yaml")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "/etc/override.yaml")
}

func TestWriteNamesFileByEpoch(t *testing.T) {
	dir := t.TempDir()
	path, err := Write(dir, 3, []byte("{}\n"))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "envoy-rev3.json"), path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "{}\n", string(b))
}

func proxyconfigWithTags(tags ...string) *meshconfig.ProxyConfig {
	pc := proxyconfig.Default()
	pc.ExtraStatTags = tags
	return pc
}
