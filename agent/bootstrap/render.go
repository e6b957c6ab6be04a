package bootstrap

import (
	"bytes"
	_ "embed" // the default template
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"text/template"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	// The Any types the default template uses must be registered for protojson.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

//go:embed envoy_bootstrap.json.tmpl
var defaultTemplate string

// DefaultTemplateName names the built-in template in errors.
const DefaultTemplateName = "built-in envoy_bootstrap.json.tmpl"

// Template is a parsed bootstrap template.
type Template struct {
	name string
	t    *template.Template
}

// DefaultTemplate returns the built-in template.
func DefaultTemplate() *Template {
	t, err := ParseTemplate(DefaultTemplateName, defaultTemplate)
	if err != nil {
		panic(err) // the embedded template is tested; failing here is a build defect
	}
	return t
}

// LoadTemplate reads a user's template (--templateFile).
func LoadTemplate(path string) (*Template, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("template file: %w", err)
	}
	return ParseTemplate(path, string(b))
}

// ParseTemplate parses a Go text/template; {{ json X }} writes X as JSON.
func ParseTemplate(name, text string) (*Template, error) {
	t, err := template.New(filepath.Base(name)).Option("missingkey=error").Funcs(template.FuncMap{
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
	}).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	return &Template{name: name, t: t}, nil
}

// Render executes the template, checks the result is a valid Envoy v3 bootstrap, merges
// the override (ISTIO_BOOTSTRAP_OVERRIDE's content, YAML or JSON; proto merge semantics:
// scalars replace, messages merge, lists append), validates the result with the Envoy
// API's rules, and returns it as indented JSON with stable key order.
func (t *Template) Render(p *Params, override []byte, overrideName string) ([]byte, error) {
	var buf bytes.Buffer
	if err := t.t.Execute(&buf, p); err != nil {
		return nil, fmt.Errorf("template %s: %w", t.name, err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(buf.Bytes(), b); err != nil {
		return nil, fmt.Errorf("template %s does not render an Envoy v3 bootstrap: %w", t.name, err)
	}
	if len(bytes.TrimSpace(override)) > 0 {
		js, err := yaml.YAMLToJSON(override)
		if err != nil {
			return nil, fmt.Errorf("bootstrap override %s: %w", overrideName, err)
		}
		o := &bootstrapv3.Bootstrap{}
		if err := protojson.Unmarshal(js, o); err != nil {
			return nil, fmt.Errorf("bootstrap override %s: %w", overrideName, err)
		}
		proto.Merge(b, o)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("bootstrap from %s is invalid: %w", t.name, err)
	}
	return Marshal(b)
}

// Marshal writes a bootstrap as indented JSON with Envoy's field names; protojson's
// output is deliberately unstable in whitespace, so it is re-indented for golden files
// and for humans reading envoy-rev<N>.json.
func Marshal(b *bootstrapv3.Bootstrap) ([]byte, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// FileName is the bootstrap of an epoch, named as pilot-agent names it.
func FileName(epoch int) string { return fmt.Sprintf("envoy-rev%d.json", epoch) }

// Write writes the bootstrap of an epoch into dir, replacing the file atomically so a
// proxy never reads half of it.
func Write(dir string, epoch int, data []byte) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("config path: %w", err)
	}
	path := filepath.Join(dir, FileName(epoch))
	tmp, err := os.CreateTemp(dir, ".envoy-rev-*")
	if err != nil {
		return "", fmt.Errorf("config path: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return path, nil
}
