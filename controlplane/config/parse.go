package config

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	extensions "istio.io/api/extensions/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	networkingbeta "istio.io/api/networking/v1beta1"
	security "istio.io/api/security/v1beta1"
	telemetry "istio.io/api/telemetry/v1alpha1"
	"sigs.k8s.io/yaml"
)

// DefaultNamespace is used for documents without metadata.namespace, as kubectl would.
const DefaultNamespace = "default"

type kindInfo struct {
	group    string
	versions []string
	newSpec  func() proto.Message
	validate func(spec proto.Message) *FieldError
}

var kinds = map[Kind]kindInfo{
	ServiceEntry:          {"networking.istio.io", []string{"v1", "v1beta1", "v1alpha3"}, func() proto.Message { return &networking.ServiceEntry{} }, validateServiceEntry},
	WorkloadEntry:         {"networking.istio.io", []string{"v1", "v1beta1", "v1alpha3"}, func() proto.Message { return &networking.WorkloadEntry{} }, validateWorkloadEntry},
	WorkloadGroup:         {"networking.istio.io", []string{"v1", "v1beta1", "v1alpha3"}, func() proto.Message { return &networking.WorkloadGroup{} }, validateWorkloadGroup},
	VirtualService:        {"networking.istio.io", []string{"v1", "v1beta1", "v1alpha3"}, func() proto.Message { return &networking.VirtualService{} }, validateVirtualService},
	DestinationRule:       {"networking.istio.io", []string{"v1", "v1beta1", "v1alpha3"}, func() proto.Message { return &networking.DestinationRule{} }, validateDestinationRule},
	Gateway:               {"networking.istio.io", []string{"v1", "v1beta1", "v1alpha3"}, func() proto.Message { return &networking.Gateway{} }, validateGateway},
	Sidecar:               {"networking.istio.io", []string{"v1", "v1beta1", "v1alpha3"}, func() proto.Message { return &networking.Sidecar{} }, validateSidecar},
	EnvoyFilter:           {"networking.istio.io", []string{"v1alpha3"}, func() proto.Message { return &networking.EnvoyFilter{} }, validateEnvoyFilterSpec},
	ProxyConfig:           {"networking.istio.io", []string{"v1beta1"}, func() proto.Message { return &networkingbeta.ProxyConfig{} }, nil},
	WasmPlugin:            {"extensions.istio.io", []string{"v1alpha1"}, func() proto.Message { return &extensions.WasmPlugin{} }, validateWasmPluginSpec},
	Telemetry:             {"telemetry.istio.io", []string{"v1", "v1alpha1"}, func() proto.Message { return &telemetry.Telemetry{} }, validateTelemetrySpec},
	AuthorizationPolicy:   {"security.istio.io", []string{"v1", "v1beta1"}, func() proto.Message { return &security.AuthorizationPolicy{} }, validateAuthorizationPolicy},
	PeerAuthentication:    {"security.istio.io", []string{"v1", "v1beta1"}, func() proto.Message { return &security.PeerAuthentication{} }, validatePeerAuthentication},
	RequestAuthentication: {"security.istio.io", []string{"v1", "v1beta1"}, func() proto.Message { return &security.RequestAuthentication{} }, nil},
}

// Kinds lists every kind the parser accepts.
func Kinds() []Kind {
	out := make([]Kind, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	sortKinds(out)
	return out
}

func sortKinds(ks []Kind) {
	for i := 1; i < len(ks); i++ {
		for j := i; j > 0 && ks[j] < ks[j-1]; j-- {
			ks[j], ks[j-1] = ks[j-1], ks[j]
		}
	}
}

// Document is the outcome of parsing one YAML document: a config, or an error, and the key
// when the document named one (so the last good version of a rejected config can be kept).
type Document struct {
	Index  int // 1-based position in the file
	Config *Config
	Key    *Key
	Err    *Error
}

// header is the Kubernetes envelope; unknown top-level and metadata fields are rejected.
type header struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   metadata        `json:"metadata"`
	Spec       json.RawMessage `json:"spec"`
	Status     json.RawMessage `json:"status,omitempty"`
}

type metadata struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	Generation        int64             `json:"generation,omitempty"`
	UID               string            `json:"uid,omitempty"`
	CreationTimestamp string            `json:"creationTimestamp,omitempty"`
}

// ParseFile splits data into YAML documents and parses each one. Empty documents are
// skipped (but still counted, so document numbers match what an editor shows between
// "---" separators).
func ParseFile(file string, data []byte) []Document {
	var out []Document
	for i, doc := range splitDocuments(data) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		out = append(out, parseDocument(file, i+1, doc))
	}
	return out
}

var separator = regexp.MustCompile(`^---\s*(#.*)?$`)

func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		if separator.Match(line) {
			docs = append(docs, append([]byte(nil), cur.Bytes()...))
			cur.Reset()
			continue
		}
		cur.Write(line)
		cur.WriteByte('\n')
	}
	docs = append(docs, cur.Bytes())
	return docs
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			b.Write(l)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func parseDocument(file string, index int, doc []byte) Document {
	d := Document{Index: index}
	fail := func(field string, err error) Document {
		d.Err = &Error{File: file, Doc: index, Key: d.Key, Field: field, Err: err}
		return d
	}
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return fail("", fmt.Errorf("invalid YAML: %w", err))
	}
	// Name the config first, leniently, so a document that fails later is still known by key.
	var loose struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if json.Unmarshal(js, &loose) == nil && loose.Kind != "" && loose.Metadata.Name != "" {
		ns := loose.Metadata.Namespace
		if ns == "" {
			ns = DefaultNamespace
		}
		d.Key = &Key{Kind: Kind(loose.Kind), Namespace: ns, Name: loose.Metadata.Name}
	}
	var h header
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return fail("", fmt.Errorf("invalid resource: %w", err))
	}
	c, field, err := configOf(h, DocumentSource(file, index))
	if err != nil {
		return fail(field, err)
	}
	d.Config = c
	return d
}

// configOf checks the envelope h (kind, apiVersion, name, namespace), decodes its spec into
// the kind's istio.io/api message and validates it. A failure names the field at fault.
func configOf(h header, source string) (*Config, string, error) {
	fail := func(field string, err error) (*Config, string, error) { return nil, field, err }
	if h.Kind == "" {
		return fail("kind", errors.New("missing"))
	}
	info, ok := kinds[Kind(h.Kind)]
	if !ok {
		return fail("kind", fmt.Errorf("unsupported kind %q", h.Kind))
	}
	group, version, _ := strings.Cut(h.APIVersion, "/")
	if group != info.group || !contains(info.versions, version) {
		return fail("apiVersion", fmt.Errorf("%q is not a version of %s (want %s/{%s})", h.APIVersion, h.Kind, info.group, strings.Join(info.versions, ",")))
	}
	if h.Metadata.Name == "" {
		return fail("metadata.name", errors.New("missing"))
	}
	if err := validateDNSLabel(h.Metadata.Name, 253); err != nil {
		return fail("metadata.name", err)
	}
	ns := h.Metadata.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	if err := validateDNSLabel(ns, 63); err != nil {
		return fail("metadata.namespace", err)
	}
	var created time.Time
	if ts := h.Metadata.CreationTimestamp; ts != "" {
		t, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			return fail("metadata.creationTimestamp", fmt.Errorf("%q is not an RFC 3339 time", ts))
		}
		created = t
	}
	spec := info.newSpec()
	if len(h.Spec) == 0 || string(h.Spec) == "null" {
		return fail("spec", errors.New("missing"))
	}
	specJSON, err := normalizeDurations(h.Spec, spec.ProtoReflect().Descriptor())
	if err != nil {
		return fail("spec", err)
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(specJSON, spec); err != nil {
		return fail("spec", errors.New(cleanProtoJSONError(err)))
	}
	if info.validate != nil {
		if fe := info.validate(spec); fe != nil {
			return fail("spec."+fe.Field, fe.Err)
		}
	}
	return &Config{
		Meta: Meta{
			Kind: Kind(h.Kind), Group: group, Version: version,
			Name: h.Metadata.Name, Namespace: ns,
			Labels: h.Metadata.Labels, Annotations: h.Metadata.Annotations,
			Source: source, Created: created,
		},
		Spec: spec,
	}, "", nil
}

// DocumentSource names where a config came from: its file and document ("file#document",
// documents counted from 1), as Meta.Source holds it.
func DocumentSource(file string, index int) string { return fmt.Sprintf("%s#%d", file, index) }

// protojson errors read "proto: (line 1:23): unknown field \"x\""; the position refers to the
// JSON form, which the user never saw, so only the message is kept.
var protoPos = regexp.MustCompile(`^proto:\s*(\(line \d+:\d+\):\s*)?`)

func cleanProtoJSONError(err error) string {
	return protoPos.ReplaceAllString(strings.ReplaceAll(err.Error(), "\u00a0", " "), "")
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
