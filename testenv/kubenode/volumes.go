package kubenode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A file of a volume's payload.
type file struct {
	data []byte
	mode os.FileMode
}

type token struct {
	value     string
	refreshAt time.Time
}

// volumeDirs says where each of the pod's volumes is: a directory under the pod's
// directory, or a hostPath volume's own path. Volumes of other kinds are left out (a
// container mounting one cannot start); unsupported says why.
func volumeDirs(pod *corev1.Pod, podDir string) (dirs map[string]string, unsupported map[string]string) {
	dirs, unsupported = map[string]string{}, map[string]string{}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.HostPath != nil:
			dirs[v.Name] = v.HostPath.Path
		case v.EmptyDir != nil, v.ConfigMap != nil, v.Secret != nil, v.DownwardAPI != nil, v.Projected != nil:
			dirs[v.Name] = filepath.Join(podDir, "volumes", v.Name)
		default:
			unsupported[v.Name] = fmt.Sprintf("volume %q: only emptyDir, configMap, secret, downwardAPI, projected and hostPath volumes are supported by kubenode", v.Name)
		}
	}
	return dirs, unsupported
}

// syncVolumes makes (or brings up to date) every volume of the pod: ConfigMap, Secret,
// downward-API and projected contents are written as the kubelet writes them (see
// writeAtomic); emptyDirs are made once.
func (r *podRun) syncVolumes(ctx context.Context) error {
	pod := r.podCopy()
	for _, v := range pod.Spec.Volumes {
		dir, ok := r.volumePaths[v.Name]
		if !ok {
			continue
		}
		switch {
		case v.EmptyDir != nil:
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return err
			}
		case v.HostPath != nil:
			if err := makeHostPath(v.HostPath); err != nil {
				return fmt.Errorf("volume %q: %w", v.Name, err)
			}
		default:
			payload, err := r.volumePayload(ctx, pod, v)
			if err != nil {
				return fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", v.Name, err)
			}
			if err := writeAtomic(dir, payload); err != nil {
				return fmt.Errorf("volume %q: %w", v.Name, err)
			}
		}
	}
	return nil
}

func makeHostPath(hp *corev1.HostPathVolumeSource) error {
	switch t := hp.Type; {
	case t != nil && *t == corev1.HostPathDirectoryOrCreate:
		return os.MkdirAll(hp.Path, 0o755)
	case t != nil && *t == corev1.HostPathFileOrCreate:
		f, err := os.OpenFile(hp.Path, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}
	return nil
}

func (r *podRun) volumePayload(ctx context.Context, pod *corev1.Pod, v corev1.Volume) (map[string]file, error) {
	payload := map[string]file{}
	mode := func(m *int32) os.FileMode {
		if m == nil {
			return 0o644
		}
		return os.FileMode(*m)
	}
	switch {
	case v.ConfigMap != nil:
		cm := v.ConfigMap
		return payload, r.keyFiles(ctx, pod.Namespace, "configmap", cm.Name, cm.Items, optional(cm.Optional), mode(cm.DefaultMode), payload)
	case v.Secret != nil:
		s := v.Secret
		return payload, r.keyFiles(ctx, pod.Namespace, "secret", s.SecretName, s.Items, optional(s.Optional), mode(s.DefaultMode), payload)
	case v.DownwardAPI != nil:
		return payload, r.downwardFiles(pod, v.DownwardAPI.Items, mode(v.DownwardAPI.DefaultMode), payload)
	}
	p := v.Projected
	for i, src := range p.Sources {
		var err error
		switch {
		case src.ConfigMap != nil:
			err = r.keyFiles(ctx, pod.Namespace, "configmap", src.ConfigMap.Name, src.ConfigMap.Items, optional(src.ConfigMap.Optional), mode(p.DefaultMode), payload)
		case src.Secret != nil:
			err = r.keyFiles(ctx, pod.Namespace, "secret", src.Secret.Name, src.Secret.Items, optional(src.Secret.Optional), mode(p.DefaultMode), payload)
		case src.DownwardAPI != nil:
			err = r.downwardFiles(pod, src.DownwardAPI.Items, mode(p.DefaultMode), payload)
		case src.ServiceAccountToken != nil:
			var tok string
			tok, err = r.token(ctx, pod, fmt.Sprintf("%s/%d", v.Name, i), src.ServiceAccountToken)
			payload[src.ServiceAccountToken.Path] = file{data: []byte(tok), mode: mode(p.DefaultMode)}
		default:
			err = fmt.Errorf("projected source %d: only configMap, secret, downwardAPI and serviceAccountToken are supported by kubenode", i)
		}
		if err != nil {
			return nil, err
		}
	}
	return payload, nil
}

// keyFiles is a ConfigMap's or Secret's data as files: every key, or the items asked for.
func (r *podRun) keyFiles(ctx context.Context, ns, kind, name string, items []corev1.KeyToPath, opt bool, mode os.FileMode, out map[string]file) error {
	data, err := r.keyData(ctx, ns, kind, name, opt)
	if err != nil {
		return err
	}
	if len(items) == 0 {
		for k, v := range data {
			out[k] = file{data: v, mode: mode}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if opt {
				continue
			}
			return fmt.Errorf("%s %q has no key %q", kind, name, it.Key)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode)
		}
		out[it.Path] = file{data: v, mode: m}
	}
	return nil
}

func (r *podRun) downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, mode os.FileMode, out map[string]file) error {
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = r.fieldValue(pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			v, err = r.resourceValue(pod, nil, it.ResourceFieldRef)
		}
		if err != nil {
			return fmt.Errorf("downward API item %q: %w", it.Path, err)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode)
		}
		out[it.Path] = file{data: []byte(v), mode: m}
	}
	return nil
}

// token is a service-account token for the pod (TokenRequest, bound to the pod), kept
// until 80% of its lifetime has passed, as the kubelet refreshes projected tokens.
func (r *podRun) token(ctx context.Context, pod *corev1.Pod, key string, src *corev1.ServiceAccountTokenProjection) (string, error) {
	r.mu.Lock()
	t, ok := r.tokens[key]
	r.mu.Unlock()
	if ok && time.Now().Before(t.refreshAt) {
		return t.value, nil
	}
	exp := int64(3600)
	if src.ExpirationSeconds != nil {
		exp = *src.ExpirationSeconds
	}
	req := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		ExpirationSeconds: &exp,
		BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	resp, err := r.node.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("failed to fetch token for service account %s/%s: %w", pod.Namespace, sa, err)
	}
	issued := time.Now()
	life := resp.Status.ExpirationTimestamp.Sub(issued)
	if life <= 0 || life > time.Duration(exp)*time.Second {
		life = time.Duration(exp) * time.Second
	}
	r.mu.Lock()
	r.tokens[key] = token{value: resp.Status.Token, refreshAt: issued.Add(life * 8 / 10)}
	r.mu.Unlock()
	return resp.Status.Token, nil
}

// writeAtomic writes a volume's payload the way the kubelet's atomic writer does, so that a
// reader never sees half an update and a watcher sees one change: the files go into a new
// hidden directory "..<timestamp>", the symlink "..data" is switched to it in one rename,
// and each top-level name is a symlink into "..data". Nothing is written when the payload
// did not change.
func writeAtomic(dir string, payload map[string]file) error {
	for p := range payload {
		if filepath.IsAbs(p) || strings.HasPrefix(filepath.Clean(p), "..") || p == "" {
			return fmt.Errorf("invalid path %q in the volume's payload", p)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	if old != "" && samePayload(filepath.Join(dir, old), payload) {
		return nil
	}
	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	for p, f := range payload {
		target := filepath.Join(ts, p)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(target, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(target, f.mode); err != nil {
			return err
		}
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	return linkTopLevel(dir, old, payload)
}

// linkTopLevel points each top-level name of the payload into ..data, removes the names
// the payload no longer has and the previous timestamped directory.
func linkTopLevel(dir, old string, payload map[string]file) error {
	top := map[string]bool{}
	for p := range payload {
		top[strings.SplitN(filepath.ToSlash(filepath.Clean(p)), "/", 2)[0]] = true
	}
	for name := range top {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") && !top[e.Name()] {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

// samePayload reports whether dir holds exactly payload (contents and modes).
func samePayload(dir string, payload map[string]file) bool {
	n := 0
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		rel, _ := filepath.Rel(dir, p)
		f, ok := payload[rel]
		if !ok {
			return fmt.Errorf("extra %s", rel)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil || string(b) != string(f.data) || info.Mode().Perm() != f.mode.Perm() {
			return fmt.Errorf("changed %s", rel)
		}
		return nil
	})
	return err == nil && n == len(payload)
}
