// Package bootstrap reads an Envoy v3 bootstrap (JSON or YAML) into go-control-plane's
// Bootstrap type, validates it the way Envoy does at start-up, and applies the command
// line's overrides (--service-node, --service-cluster).
package bootstrap

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// UserAgentName is what the proxy reports as node.user_agent_name. It is Envoy's name, as
// control planes (Istio's included) select behaviour by it.
const UserAgentName = "envoy"

// UserAgentVersion identifies the stand-in.
const UserAgentVersion = "meshproxy"

// Overrides are the command-line values that replace bootstrap fields, as Envoy's do.
type Overrides struct {
	ServiceNode    string
	ServiceCluster string
}

// Load reads and validates the bootstrap at path. YAML is chosen by the .yaml/.yml
// extension or when the content is not a JSON object; unknown fields are errors.
func Load(path string, o Overrides) (*bootstrapv3.Bootstrap, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	b, err := Parse(data, isYAML(path, data))
	if err != nil {
		return nil, fmt.Errorf("bootstrap %s: %w", path, err)
	}
	Apply(b, o)
	return b, nil
}

func isYAML(path string, data []byte) bool {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		return true
	case ".json":
		return false
	}
	return !bytes.HasPrefix(bytes.TrimSpace(data), []byte("{"))
}

// Parse decodes and validates a bootstrap document.
func Parse(data []byte, yamlInput bool) (*bootstrapv3.Bootstrap, error) {
	if yamlInput {
		j, err := yaml.YAMLToJSON(data)
		if err != nil {
			return nil, fmt.Errorf("yaml: %w", err)
		}
		data = j
	}
	b := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(data, b); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("invalid: %w", err)
	}
	return b, nil
}

// Apply sets the command-line overrides and the proxy's user agent on the node.
func Apply(b *bootstrapv3.Bootstrap, o Overrides) {
	if b.Node == nil {
		b.Node = &corev3.Node{}
	}
	if o.ServiceNode != "" {
		b.Node.Id = o.ServiceNode
	}
	if o.ServiceCluster != "" {
		b.Node.Cluster = o.ServiceCluster
	}
	b.Node.UserAgentName = UserAgentName
	b.Node.UserAgentVersionType = &corev3.Node_UserAgentVersion{UserAgentVersion: UserAgentVersion}
}
