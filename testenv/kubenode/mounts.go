package kubenode

import (
	"encoding/json"
	"path"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// EnvMounts is the environment variable that tells every container where its volume
// mounts are: a JSON object from each mount path (as the pod spec writes it, e.g.
// "/etc/istio/pod") to the directory or file that holds it on this machine. A program that
// has a mount path built in (a default it is not given on its command line) reads it to
// find the file.
const EnvMounts = "WASMESH_MOUNTS"

// A mount is a container's volume mount: where the container expects it and where it is.
type mount struct{ path, source string }

// mounts are a container's mounts, longest path first so that a nested mount wins.
type mounts []mount

// containerMounts maps c's volumeMounts to the pod's volume directories; a mount of a
// volume the pod does not have, or of an unsupported kind, is a configError.
func (r *podRun) containerMounts(c *corev1.Container) (mounts, error) {
	var ms mounts
	for _, vm := range c.VolumeMounts {
		src, ok := r.volumePaths[vm.Name]
		if !ok {
			return nil, configErrorf("volume mount %q: the pod has no volume %q the node can provide", vm.MountPath, vm.Name)
		}
		if vm.SubPath != "" {
			src = filepath.Join(src, vm.SubPath)
		}
		p := path.Clean(vm.MountPath)
		if p == "/" {
			return nil, configErrorf("volume mount of %q at /: the node cannot mount over a process's root", vm.Name)
		}
		ms = append(ms, mount{path: p, source: src})
	}
	sort.SliceStable(ms, func(i, j int) bool { return len(ms[i].path) > len(ms[j].path) })
	return ms, nil
}

// rewrite replaces every mount path in s by where the mount is. A mount path is replaced
// where it stands as a path of its own: at the start of s or after a separator (space,
// '=', ':', ',', ';', a quote, '(') and followed by the end, '/' or such a separator; so
// "--podInfoDir=/etc/istio/pod", "/etc/istio/pod/labels" and "sh -c 'cat /data/x'" are
// rewritten and "/etc/istio/podinfo" is not (unless it is a mount itself).
func (ms mounts) rewrite(s string) string {
	if len(ms) == 0 || !strings.Contains(s, "/") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		if i == 0 || strings.IndexByte(pathSeparators, s[i-1]) >= 0 {
			if m, ok := ms.match(s[i:]); ok {
				b.WriteString(m.source)
				i += len(m.path)
				continue
			}
		}
		b.WriteByte(s[i])
		i++
	}
	return b.String()
}

const pathSeparators = " \t\n=:,;'\"()"

func (ms mounts) match(s string) (mount, bool) {
	for _, m := range ms {
		if !strings.HasPrefix(s, m.path) {
			continue
		}
		if rest := s[len(m.path):]; rest == "" || rest[0] == '/' || strings.IndexByte(pathSeparators, rest[0]) >= 0 {
			return m, true
		}
	}
	return mount{}, false
}

func (ms mounts) rewriteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = ms.rewrite(a)
	}
	return out
}

func (ms mounts) json() string {
	m := make(map[string]string, len(ms))
	for _, mt := range ms {
		m[mt.path] = mt.source
	}
	b, _ := json.Marshal(m)
	return string(b)
}
