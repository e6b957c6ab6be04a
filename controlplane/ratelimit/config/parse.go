package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Load reads every .yaml and .yml file of dir (names starting with a dot, such as a mounted
// ConfigMap's ..data, are skipped). Any bad file fails the whole load, each error naming its
// file, so that the caller keeps its last good config.
func Load(dir string) (*Config, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the rate-limit config directory: %w", err)
	}
	cfg := &Config{Domains: map[string]*Domain{}}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		ext := filepath.Ext(name)
		if strings.HasPrefix(name, ".") || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		path := filepath.Join(dir, name)
		if st, err := os.Stat(path); err != nil || st.IsDir() {
			continue // a dangling link or a directory: not a file of ours
		}
		data, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, &Error{File: name, Err: err})
			continue
		}
		d, err := Parse(name, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev := cfg.Domains[d.Name]; prev != nil {
			errs = append(errs, &Error{File: name, Path: "domain", Err: fmt.Errorf("domain %q is already defined in %s", d.Name, prev.File)})
			continue
		}
		cfg.Domains[d.Name] = d
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

// Parse reads one file: a single YAML document with one domain.
func Parse(file string, data []byte) (*Domain, error) {
	fail := func(path string, err error) (*Domain, error) {
		return nil, &Error{File: file, Path: path, Err: err}
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fail("", fmt.Errorf("invalid YAML: %w", err))
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return fail("", fmt.Errorf("invalid YAML: %w", err))
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return fail("", fmt.Errorf("want a mapping with domain and descriptors, got %s", kind(doc)))
	}
	p := &parser{}
	d := &Domain{File: file}
	if err := p.fields(top, "", []string{"domain", "descriptors", "failure_mode_deny"}); err != nil {
		return fail(p.path, err)
	}
	if d.Name, err = p.str(top, "", "domain", true); err != nil {
		return fail(p.path, err)
	}
	if d.FailureModeDeny, err = p.boolean(top, "", "failure_mode_deny"); err != nil {
		return fail(p.path, err)
	}
	if err := p.level(top["descriptors"], "descriptors", d.Name, &d.root); err != nil {
		return fail(p.path, err)
	}
	return d, nil
}

// parser remembers the path of the field it failed on.
type parser struct{ path string }

func join(prefix, field string) string {
	if prefix == "" {
		return field
	}
	return prefix + "." + field
}

func (p *parser) fields(m map[string]any, at string, allowed []string) error {
	var names []string
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		found := false
		for _, a := range allowed {
			found = found || a == k
		}
		if !found {
			p.path = join(at, k)
			return fmt.Errorf("unknown field %q (want one of %s)", k, strings.Join(allowed, ", "))
		}
	}
	return nil
}

func (p *parser) str(m map[string]any, at, field string, required bool) (string, error) {
	v, ok := m[field]
	if !ok || v == nil {
		if required {
			p.path = join(at, field)
			return "", errors.New("required")
		}
		return "", nil
	}
	switch s := v.(type) {
	case string:
		if required && s == "" {
			p.path = join(at, field)
			return "", errors.New("must not be empty")
		}
		return s, nil
	case json.Number: // YAML users write `value: 200` for a status code
		return s.String(), nil
	}
	p.path = join(at, field)
	return "", fmt.Errorf("want a string, got %s", kind(v))
}

func (p *parser) boolean(m map[string]any, at, field string) (bool, error) {
	v, ok := m[field]
	if !ok || v == nil {
		return false, nil
	}
	b, ok := v.(bool)
	if !ok {
		p.path = join(at, field)
		return false, fmt.Errorf("want true or false, got %s", kind(v))
	}
	return b, nil
}

// level reads a list of descriptors into n.
func (p *parser) level(v any, at, keyPrefix string, n *node) error {
	if v == nil {
		return nil
	}
	list, ok := v.([]any)
	if !ok {
		p.path = at
		return fmt.Errorf("want a list of descriptors, got %s", kind(v))
	}
	n.children = map[string]*descriptor{}
	for i, item := range list {
		here := fmt.Sprintf("%s[%d]", at, i)
		m, ok := item.(map[string]any)
		if !ok {
			p.path = here
			return fmt.Errorf("want a descriptor (key, value, rate_limit, descriptors), got %s", kind(item))
		}
		if err := p.fields(m, here, []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric"}); err != nil {
			return err
		}
		key, err := p.str(m, here, "key", true)
		if err != nil {
			return err
		}
		value, err := p.str(m, here, "value", false)
		if err != nil {
			return err
		}
		name := key
		if value != "" {
			name = key + "_" + value
		}
		if _, dup := n.children[name]; dup {
			p.path = here
			return fmt.Errorf("duplicate descriptor key %q value %q at this level", key, value)
		}
		d := &descriptor{}
		if err := p.descriptor(m, here, keyPrefix+"."+name, d); err != nil {
			return err
		}
		n.children[name] = d
		if strings.Contains(value, "*") {
			n.wildcards = append(n.wildcards, wildcard{key: key, parts: strings.Split(value, "*"), d: d})
		}
	}
	return nil
}

func (p *parser) descriptor(m map[string]any, at, key string, d *descriptor) error {
	shadow, err := p.boolean(m, at, "shadow_mode")
	if err != nil {
		return err
	}
	detailed, err := p.boolean(m, at, "detailed_metric")
	if err != nil {
		return err
	}
	if rl, ok := m["rate_limit"]; ok && rl != nil {
		if d.limit, err = p.limit(rl, join(at, "rate_limit")); err != nil {
			return err
		}
		d.limit.ShadowMode, d.limit.DetailedMetric, d.limit.Key = shadow, detailed, key
	}
	return p.level(m["descriptors"], join(at, "descriptors"), key, &d.node)
}

func (p *parser) limit(v any, at string) (*Limit, error) {
	m, ok := v.(map[string]any)
	if !ok {
		p.path = at
		return nil, fmt.Errorf("want a mapping with unit and requests_per_unit, got %s", kind(v))
	}
	if err := p.fields(m, at, []string{"unit", "requests_per_unit", "unlimited", "name"}); err != nil {
		return nil, err
	}
	l := &Limit{}
	var err error
	if l.Unlimited, err = p.boolean(m, at, "unlimited"); err != nil {
		return nil, err
	}
	if l.Name, err = p.str(m, at, "name", false); err != nil {
		return nil, err
	}
	unit, err := p.str(m, at, "unit", !l.Unlimited)
	if err != nil {
		return nil, err
	}
	_, hasRPU := m["requests_per_unit"]
	if l.Unlimited {
		if unit != "" || hasRPU {
			p.path = at
			return nil, errors.New("an unlimited limit takes neither unit nor requests_per_unit")
		}
		return l, nil
	}
	u, ok := units[strings.ToLower(unit)]
	if !ok {
		p.path = join(at, "unit")
		return nil, fmt.Errorf("unknown unit %q (want second, minute, hour or day)", unit)
	}
	l.Unit = u
	num, ok := m["requests_per_unit"].(json.Number)
	if !hasRPU {
		p.path = join(at, "requests_per_unit")
		return nil, errors.New("required")
	}
	n, err := strconv.ParseUint(num.String(), 10, 32)
	if !ok || err != nil {
		p.path = join(at, "requests_per_unit")
		return nil, fmt.Errorf("want a whole number from 0 to %d, got %v", uint32(1<<32-1), m["requests_per_unit"])
	}
	l.RequestsPerUnit = uint32(n)
	return l, nil
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "nothing"
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	}
	return fmt.Sprintf("%T", v)
}
