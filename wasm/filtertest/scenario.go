// Package filtertest runs YAML scenarios against any proxy-wasm filter offline: a plugin
// configuration, requests with the upstream's answers, and the status, headers, metrics and
// logs each request must produce. It is what bin/filtertest runs, so that users can check
// their own filters in CI without a proxy.
package filtertest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Scenario is one file: a filter, how it is configured, and the cases run against it in
// order. Cases share one plugin, so metrics, shared data and the clock carry over.
type Scenario struct {
	// Wasm is the module to load, relative to the scenario file.
	Wasm   string `json:"wasm"`
	Plugin Plugin `json:"plugin"`
	// Properties are the proxy's attributes, by first path segment: node (id, cluster,
	// metadata, locality), xds, listener_direction, ...
	Properties map[string]any `json:"properties,omitempty"`
	// HTTPCalls answers the filter's http_call by cluster name; calls to other clusters
	// are rejected as an unknown cluster.
	HTTPCalls map[string]CallAnswer `json:"httpCalls,omitempty"`
	// GRPCCalls answers the filter's grpc_call by cluster name (envoy_grpc.cluster_name or
	// the plain name it passed); calls to other clusters are rejected as an unknown
	// cluster.
	GRPCCalls map[string]GRPCAnswer `json:"grpcCalls,omitempty"`
	Cases     []Case                `json:"cases,omitempty"`

	dir string
}

// Plugin is the part of Envoy's envoy.extensions.wasm.v3.PluginConfig that shapes how the
// filter behaves.
type Plugin struct {
	Name   string `json:"name,omitempty"`
	RootID string `json:"rootID,omitempty"`
	VMID   string `json:"vmID,omitempty"`
	// Configuration and VMConfiguration are handed to the filter as bytes: a YAML string
	// as written, any other YAML value as its JSON encoding.
	Configuration   json.RawMessage `json:"configuration,omitempty"`
	VMConfiguration json.RawMessage `json:"vmConfiguration,omitempty"`
	FailOpen        bool            `json:"failOpen,omitempty"`
	// Instances is the number of VM instances (Envoy: one per worker thread).
	Instances int `json:"instances,omitempty"`
	// CallbackTimeout bounds each callback (runaway guests); MemoryLimitBytes each
	// instance's linear memory. Zero keeps the host's defaults.
	CallbackTimeout  Duration `json:"callbackTimeout,omitempty"`
	MemoryLimitBytes uint64   `json:"memoryLimitBytes,omitempty"`
	// ExpectStartError makes the scenario a check that the plugin refuses to start with an
	// error containing this text; such a scenario has no cases.
	ExpectStartError string `json:"expectStartError,omitempty"`
}

// CallAnswer is how the upstream of an http_call answers.
type CallAnswer struct {
	Status   int               `json:"status,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	Body     string            `json:"body,omitempty"`
	Trailers map[string]string `json:"trailers,omitempty"`
	// Delay is the virtual time before the answer arrives.
	Delay Duration `json:"delay,omitempty"`
	// NoAnswer leaves the call to time out; Fail resets it.
	NoAnswer bool `json:"noAnswer,omitempty"`
	Fail     bool `json:"fail,omitempty"`
}

// GRPCAnswer is how the service of a grpc_call answers.
type GRPCAnswer struct {
	// Message is the response message as written; MessageBase64 the same in base64, for
	// the serialized protobuf a real service sends. Only delivered with status 0.
	Message       string `json:"message,omitempty"`
	MessageBase64 string `json:"messageBase64,omitempty"`
	// Status is the gRPC status code (0: OK), StatusMessage its grpc-message.
	Status        uint32 `json:"status,omitempty"`
	StatusMessage string `json:"statusMessage,omitempty"`
	// InitialMetadata and TrailingMetadata are the answer's headers and trailers.
	InitialMetadata  map[string]string `json:"initialMetadata,omitempty"`
	TrailingMetadata map[string]string `json:"trailingMetadata,omitempty"`
	// Delay is the virtual time before the answer arrives.
	Delay Duration `json:"delay,omitempty"`
	// NoAnswer leaves the call to time out (DEADLINE_EXCEEDED); Fail ends it without an
	// answer (UNAVAILABLE, as a connect failure).
	NoAnswer bool `json:"noAnswer,omitempty"`
	Fail     bool `json:"fail,omitempty"`
}

// Case is one request through the filter.
type Case struct {
	Name string `json:"name"`
	// Advance moves the virtual clock before the request, firing due ticks.
	Advance Duration `json:"advance,omitempty"`
	// Worker pins the request to one instance.
	Worker   *int     `json:"worker,omitempty"`
	Request  Request  `json:"request"`
	Upstream Upstream `json:"upstream,omitempty"`
	Expect   Expect   `json:"expect"`
}

// Request is what the downstream client sends.
type Request struct {
	Method    string            `json:"method,omitempty"`
	Path      string            `json:"path,omitempty"`
	Authority string            `json:"authority,omitempty"`
	Scheme    string            `json:"scheme,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	// Body is sent chunk by chunk.
	Body     []string          `json:"body,omitempty"`
	Trailers map[string]string `json:"trailers,omitempty"`
	// Protocol ("HTTP/1.1", "HTTP/2"), Source and Destination ("ip:port") are the stream's
	// request.protocol, source.address and destination.address.
	Protocol    string `json:"protocol,omitempty"`
	Source      string `json:"source,omitempty"`
	Destination string `json:"destination,omitempty"`
}

// Upstream is the answer of the service behind the filter, used unless the filter answers
// locally. Status defaults to 200.
type Upstream struct {
	Status   int               `json:"status,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	Body     []string          `json:"body,omitempty"`
	Trailers map[string]string `json:"trailers,omitempty"`
}

// Expect lists what must hold after the case; fields left out are not checked.
type Expect struct {
	// Status is the status the client got.
	Status int `json:"status,omitempty"`
	// LocalResponse says whether the filter (or its failure) answered instead of the
	// upstream.
	LocalResponse *bool `json:"localResponse,omitempty"`
	// RequestHeaders as the upstream saw them, ResponseHeaders as the client saw them; a
	// null value means the header must be absent.
	RequestHeaders  map[string]*string `json:"requestHeaders,omitempty"`
	ResponseHeaders map[string]*string `json:"responseHeaders,omitempty"`
	// Body is the response body the client got.
	Body *string `json:"body,omitempty"`
	// Metrics are values after the case: a counter's or gauge's value, or a histogram's
	// sample count.
	Metrics map[string]int64 `json:"metrics,omitempty"`
	// Logs must each be contained in some log line the filter wrote during the case.
	Logs []string `json:"logs,omitempty"`
	// SharedData values after the case.
	SharedData map[string]string `json:"sharedData,omitempty"`
	// Failed says whether the filter itself failed (trap, deadline, memory) on the request.
	Failed *bool `json:"failed,omitempty"`
}

// Duration is a time.Duration written as Go writes it ("1.5s", "200ms").
type Duration time.Duration

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration %s: want a string such as \"1.5s\"", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Load reads and checks a scenario file. Errors name the file, and unknown fields the
// field and its line.
func Load(path string) (*Scenario, error) {
	s, err := load(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func load(path string) (*Scenario, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	s.dir = filepath.Dir(path)
	return s, nil
}

// Parse reads a scenario; a relative Wasm path is resolved against the working directory.
func Parse(raw []byte) (*Scenario, error) {
	var s Scenario
	if err := yaml.UnmarshalStrict(raw, &s); err != nil {
		return nil, yamlError(raw, err)
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

func (s *Scenario) validate() error {
	if s.Wasm == "" {
		return fmt.Errorf("wasm: the module to load is required")
	}
	if s.Plugin.ExpectStartError != "" {
		if len(s.Cases) > 0 {
			return fmt.Errorf("plugin.expectStartError: a plugin expected not to start cannot have cases")
		}
		return nil
	}
	if len(s.Cases) == 0 {
		return fmt.Errorf("cases: at least one case is required")
	}
	instances := max(s.Plugin.Instances, 1)
	seen := map[string]bool{}
	for i, c := range s.Cases {
		where := "cases[" + strconv.Itoa(i) + "]"
		if c.Name == "" {
			return fmt.Errorf("%s.name: required", where)
		}
		if seen[c.Name] {
			return fmt.Errorf("%s.name: %q is used by an earlier case", where, c.Name)
		}
		seen[c.Name] = true
		if c.Worker != nil && (*c.Worker < 0 || *c.Worker >= instances) {
			return fmt.Errorf("%s (%s).worker: %d is out of range, the plugin has %d instance(s)", where, c.Name, *c.Worker, instances)
		}
	}
	for cluster, a := range s.HTTPCalls {
		if a.NoAnswer && a.Fail {
			return fmt.Errorf("httpCalls.%s: noAnswer and fail exclude each other", cluster)
		}
	}
	for cluster, a := range s.GRPCCalls {
		switch {
		case a.NoAnswer && a.Fail:
			return fmt.Errorf("grpcCalls.%s: noAnswer and fail exclude each other", cluster)
		case a.Message != "" && a.MessageBase64 != "":
			return fmt.Errorf("grpcCalls.%s: message and messageBase64 exclude each other", cluster)
		}
		if _, err := base64.StdEncoding.DecodeString(a.MessageBase64); err != nil {
			return fmt.Errorf("grpcCalls.%s.messageBase64: %w", cluster, err)
		}
	}
	return nil
}

var unknownField = regexp.MustCompile(`unknown field "([^"]+)"`)

// yamlError drops the decoder's JSON-conversion prefixes and, for an unknown field, adds
// the line where the field is written (the decoder only knows the field's name).
func yamlError(raw []byte, err error) error {
	msg := err.Error()
	for _, prefix := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	if m := unknownField.FindStringSubmatch(msg); m != nil {
		key := regexp.MustCompile(`(^|[\s{,\-])"?` + regexp.QuoteMeta(m[1]) + `"?\s*:`)
		for i, line := range strings.Split(string(raw), "\n") {
			if key.MatchString(line) {
				msg += fmt.Sprintf(" (line %d)", i+1)
				break
			}
		}
	}
	return errors.New(msg)
}

// WasmPath is the module's path, resolved against the scenario file's folder.
func (s *Scenario) WasmPath() string {
	if filepath.IsAbs(s.Wasm) || s.dir == "" {
		return s.Wasm
	}
	return filepath.Join(s.dir, s.Wasm)
}

// configBytes turns a YAML configuration value into the bytes the plugin receives.
func configBytes(raw json.RawMessage) []byte {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return []byte(s)
		}
	}
	return raw
}
