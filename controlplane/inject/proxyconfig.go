package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"istio.io/api/annotation"
	meshconfig "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// parseProxyConfig reads a ProxyConfig written in YAML or JSON, as the agent does
// (agent/proxyconfig): unknown fields are errors.
func parseProxyConfig(text string) (*meshconfig.ProxyConfig, error) {
	js, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %w", err)
	}
	pc := &meshconfig.ProxyConfig{}
	if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
		return pc, nil
	}
	if err := protojson.Unmarshal(js, pc); err != nil {
		return nil, fmt.Errorf("invalid ProxyConfig: %w", err)
	}
	return pc, nil
}

func checkProxyConfig(v string) error {
	pc, err := parseProxyConfig(v)
	if err != nil {
		return err
	}
	return checkProxyFields(pc)
}

// checkProxyFields refuses what the agent would refuse at start (or silently misread): the
// drain settings of seed 004 and the interception mode.
func checkProxyFields(pc *meshconfig.ProxyConfig) error {
	if d := pc.GetTerminationDrainDuration(); d != nil && d.AsDuration() < 0 {
		return errors.New("terminationDrainDuration: must not be negative")
	}
	if d := pc.GetDrainDuration(); d != nil && d.AsDuration() < 0 {
		return errors.New("drainDuration: must not be negative")
	}
	if p := pc.GetStatusPort(); p < 0 || p > 65535 {
		return fmt.Errorf("statusPort: %d is not a port", p)
	}
	if pc.GetInterceptionMode() == meshconfig.ProxyConfig_TPROXY {
		return errors.New("interceptionMode: TPROXY is not supported by wasmesh; use REDIRECT or NONE")
	}
	md := pc.GetProxyMetadata()
	if v, ok := md["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"]; ok {
		if _, err := strconv.ParseBool(v); err != nil {
			return fmt.Errorf("proxyMetadata.EXIT_ON_ZERO_ACTIVE_CONNECTIONS: %q is not true or false", v)
		}
	}
	if v, ok := md["MINIMUM_DRAIN_DURATION"]; ok {
		if d, err := time.ParseDuration(v); err != nil || d < 0 {
			return fmt.Errorf("proxyMetadata.MINIMUM_DRAIN_DURATION: %q is not a duration such as 5s", v)
		}
	}
	return nil
}

// effectiveProxyConfig is the mesh's defaultConfig with the pod's proxy.istio.io/config
// over it, each field the annotation sets replacing the default's (as the agent layers
// them).
func effectiveProxyConfig(mesh *meshconfig.MeshConfig, annotations map[string]string) (*meshconfig.ProxyConfig, error) {
	pc := proto.Clone(mesh.GetDefaultConfig()).(*meshconfig.ProxyConfig)
	if pc == nil {
		pc = &meshconfig.ProxyConfig{}
	}
	if err := checkProxyFields(pc); err != nil {
		return nil, fmt.Errorf("mesh config defaultConfig: %w", err)
	}
	if text, ok := annotations[annotation.ProxyConfig.Name]; ok {
		over, err := parseProxyConfig(text)
		if err != nil {
			return nil, annotationError(annotation.ProxyConfig.Name, text, err)
		}
		dst := pc.ProtoReflect()
		over.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			dst.Set(fd, v)
			return true
		})
	}
	return pc, nil
}

// proxyConfigJSON is PROXY_CONFIG: the ProxyConfig as compact JSON (protojson's spacing is
// deliberately unstable, so it is compacted).
func proxyConfigJSON(pc *meshconfig.ProxyConfig) (string, error) {
	b, err := protojson.Marshal(pc)
	if err != nil {
		return "", fmt.Errorf("PROXY_CONFIG: %w", err)
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return "", fmt.Errorf("PROXY_CONFIG: %w", err)
	}
	return out.String(), nil
}

// strictJSONOrYAML decodes an annotation's YAML or JSON into out, refusing unknown fields.
func strictJSONOrYAML(text string, out any) error {
	js, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		return fmt.Errorf("not YAML or JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return err
	}
	return nil
}

// parseLifecycle reads LifecycleAnnotation; a handler must say what it runs.
func parseLifecycle(text string) (*corev1.Lifecycle, error) {
	var lc corev1.Lifecycle
	if err := strictJSONOrYAML(text, &lc); err != nil {
		return nil, err
	}
	for name, h := range map[string]*corev1.LifecycleHandler{"postStart": lc.PostStart, "preStop": lc.PreStop} {
		if h == nil {
			continue
		}
		n := 0
		for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.Sleep != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("%s: want exactly one of exec, httpGet, tcpSocket, sleep", name)
		}
		if h.Exec != nil && len(h.Exec.Command) == 0 {
			return nil, fmt.Errorf("%s: exec without a command", name)
		}
		if h.Sleep != nil && h.Sleep.Seconds < 0 {
			return nil, fmt.Errorf("%s: sleep seconds must not be negative", name)
		}
	}
	return &lc, nil
}

// userVolumes reads sidecar.istio.io/userVolume: volumes by name (JSON), added to the pod.
func userVolumes(text string) ([]corev1.Volume, error) {
	var m map[string]corev1.Volume
	if err := strictJSONOrYAML(text, &m); err != nil {
		return nil, err
	}
	out := make([]corev1.Volume, 0, len(m))
	for name, v := range m {
		v.Name = name
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// userVolumeMounts reads sidecar.istio.io/userVolumeMount: the sidecar's mounts by volume
// name (JSON).
func userVolumeMounts(text string) ([]corev1.VolumeMount, error) {
	var m map[string]corev1.VolumeMount
	if err := strictJSONOrYAML(text, &m); err != nil {
		return nil, err
	}
	out := make([]corev1.VolumeMount, 0, len(m))
	for name, v := range m {
		if v.MountPath == "" {
			return nil, fmt.Errorf("%s: no mountPath", name)
		}
		v.Name = name
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
