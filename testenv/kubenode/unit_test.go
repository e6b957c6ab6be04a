package kubenode

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/wasmesh/wasmesh/agent/podinfo"
)

// $(VAR) expansion follows Kubernetes' rules (third_party/forked/golang/expansion).
func TestExpandAsKubernetes(t *testing.T) {
	vars := map[string]string{"POD_IP": "127.200.0.1", "EMPTY": "", "A": "a"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for in, want := range map[string]string{
		"--listen=$(POD_IP):8080": "--listen=127.200.0.1:8080",
		"$(A)$(A)-$(EMPTY)-":      "aa--",
		"$(UNDEFINED)":            "$(UNDEFINED)",
		"$$(A)":                   "$(A)",
		"$$$(A)":                  "$a",
		"$A $":                    "$A $",
		"$(A":                     "$(A",
		"x$(A)y$":                 "xay$",
		"no reference":            "no reference",
		"$()":                     "$()",
	} {
		assert.Equal(t, want, expand(in, lookup), "expand(%q)", in)
	}
}

// Labels and annotations are written as the kubelet writes them (fieldpath.FormatMap), and
// the agent's podinfo reads them back.
func TestFormatMapIsTheDownwardAPIFormat(t *testing.T) {
	m := map[string]string{"version": "v1", "app": "web", "note": "say \"hi\"\nbye"}
	got := formatMap(m)
	assert.Equal(t, "app=\"web\"\nnote=\"say \\\"hi\\\"\\nbye\"\nversion=\"v1\"", got)
	back, err := podinfo.Parse(got)
	require.NoError(t, err)
	assert.Equal(t, m, back)
	assert.Equal(t, "", formatMap(nil))
}

func TestImageNames(t *testing.T) {
	for ref, want := range map[string]string{
		"wasmesh/echo":                          "wasmesh/echo",
		"wasmesh/echo:latest":                   "wasmesh/echo",
		"docker.io/istio/proxyv2:1.24.0":        "istio/proxyv2",
		"localhost:5000/wasmesh/agent:dev":      "wasmesh/agent",
		"gcr.io/istio-release/proxyv2@sha256:0": "istio-release/proxyv2",
		"busybox":                               "busybox",
		"docker.io/library/busybox:1.36":        "busybox",
	} {
		assert.Equal(t, want, ImageName(ref), ref)
	}
}

// A container's command line is built as a container runtime builds it from the image's
// ENTRYPOINT and CMD.
func TestCommandLine(t *testing.T) {
	img := Image{Entrypoint: []string{"/usr/local/bin/pilot-agent"}, Cmd: []string{"default"}}
	assert.Equal(t, []string{"/usr/local/bin/pilot-agent", "default"}, commandLine(img, nil, nil))
	assert.Equal(t, []string{"/usr/local/bin/pilot-agent", "proxy", "sidecar"}, commandLine(img, nil, []string{"proxy", "sidecar"}))
	assert.Equal(t, []string{"sh"}, commandLine(img, []string{"sh"}, nil), "a command drops the image's CMD")
	assert.Equal(t, []string{"sh", "-c", "x"}, commandLine(img, []string{"sh"}, []string{"-c", "x"}))
	assert.Equal(t, []string{"sh"}, commandLine(DefaultImages()["busybox"], nil, nil))
}

// Mount paths are rewritten where they stand as paths, and only there.
func TestMountPathsAreRewritten(t *testing.T) {
	// Longest first, as containerMounts orders them.
	ms := mounts{{path: "/etc/istio/pod", source: "/tmp/p/volumes/podinfo"}, {path: "/etc/istio", source: "/tmp/p/volumes/istio"},
		{path: "/data", source: "/tmp/p/volumes/data"}}
	for in, want := range map[string]string{
		"/etc/istio/pod":                  "/tmp/p/volumes/podinfo",
		"--podInfoDir=/etc/istio/pod":     "--podInfoDir=/tmp/p/volumes/podinfo",
		"/etc/istio/pod/labels":           "/tmp/p/volumes/podinfo/labels",
		"/etc/istio/podinfo":              "/tmp/p/volumes/istio/podinfo",
		"/etc/istiod/x":                   "/etc/istiod/x",
		"/etc/istio/proxy/x":              "/tmp/p/volumes/istio/proxy/x",
		"cat /data/x > '/data/y'; ls /db": "cat /tmp/p/volumes/data/x > '/tmp/p/volumes/data/y'; ls /db",
		"/mydata /data":                   "/mydata /tmp/p/volumes/data",
		"PATH=/bin:/data/bin":             "PATH=/bin:/tmp/p/volumes/data/bin",
		"relative/data":                   "relative/data",
	} {
		assert.Equal(t, want, ms.rewrite(in), "rewrite(%q)", in)
	}
}

// A volume's files are written as the kubelet's atomic writer writes them: a timestamped
// directory behind the ..data symlink, each name a symlink into it; a change swaps
// ..data, removes what went away and the old directory; no change writes nothing.
func TestWriteAtomic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	require.NoError(t, writeAtomic(dir, map[string]file{"labels": {data: []byte("a=\"1\""), mode: 0o644},
		"sub/key": {data: []byte("k"), mode: 0o600}}))
	link, err := os.Readlink(filepath.Join(dir, "labels"))
	require.NoError(t, err)
	assert.Equal(t, "..data/labels", link)
	first, err := os.Readlink(filepath.Join(dir, "..data"))
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, "sub", "key"))
	require.NoError(t, err)
	assert.Equal(t, "k", string(b))
	st, err := os.Stat(filepath.Join(dir, "sub", "key"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	require.NoError(t, writeAtomic(dir, map[string]file{"labels": {data: []byte("a=\"1\""), mode: 0o644},
		"sub/key": {data: []byte("k"), mode: 0o600}}))
	same, _ := os.Readlink(filepath.Join(dir, "..data"))
	assert.Equal(t, first, same, "an unchanged payload is not rewritten")

	require.NoError(t, writeAtomic(dir, map[string]file{"labels": {data: []byte("a=\"2\""), mode: 0o644}}))
	second, _ := os.Readlink(filepath.Join(dir, "..data"))
	assert.NotEqual(t, first, second)
	b, err = os.ReadFile(filepath.Join(dir, "labels"))
	require.NoError(t, err)
	assert.Equal(t, "a=\"2\"", string(b))
	_, err = os.Lstat(filepath.Join(dir, "sub"))
	assert.True(t, os.IsNotExist(err), "a name the payload lost is removed")
	_, err = os.Stat(filepath.Join(dir, first))
	assert.True(t, os.IsNotExist(err), "the previous timestamped directory is removed")

	assert.Error(t, writeAtomic(dir, map[string]file{"../escape": {}}))
}

// A pod's localhost is 127.<Net+10> with its pod IP's last two octets, as newPodRun makes
// them; an address outside the pod network has none.
func TestLocalhostOfPodIP(t *testing.T) {
	n := &Node{net: 203, podNet: "198.18"}
	assert.Equal(t, "127.213.0.7", n.Localhost("198.18.0.7"))
	assert.Equal(t, "127.213.1.2", n.Localhost("198.18.1.2"))
	for _, bad := range []string{"198.19.0.7", "198.18.0", "198.18.0.7.1", "10.0.0.1", ""} {
		assert.Empty(t, n.Localhost(bad), bad)
	}
	r := newPodRun(&Node{net: 203, podNet: "198.18", dir: t.TempDir()}, &corev1.Pod{}, 251)
	assert.Equal(t, r.localhost, n.Localhost(r.ip), "the pod run's own pair")
}
