// Package deploy installs discovery on Kubernetes: the manifests in this directory (plain
// YAML, embedded) and Istio's own CustomResourceDefinitions of the kinds discovery watches,
// taken at build time from the istio.io/api module, written together into one directory for
// `kubectl apply -f`.
package deploy

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/source/kube"
)

//go:embed *.yaml
var manifests embed.FS

// CRDFile is the name Write gives the CRDs.
const CRDFile = "crds.yaml"

// DefaultImage is the discovery image the Deployment names.
const DefaultImage = "wasmesh/discovery:latest"

// Manifest is one of the manifests: its file name and content.
type Manifest struct {
	Name string
	Data []byte
}

// Manifests returns the manifests in the order they are applied (their file names sort so).
func Manifests() ([]Manifest, error) {
	entries, err := fs.ReadDir(manifests, ".")
	if err != nil {
		return nil, err
	}
	var out []Manifest
	for _, e := range entries { // ReadDir sorts by name
		data, err := manifests.ReadFile(e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, Manifest{Name: e.Name(), Data: data})
	}
	return out, nil
}

// IstioCRDFile is Istio's CRD file in the istio.io/api module this module builds with
// (kubernetes/customresourcedefinitions.gen.yaml), found with `go list` run in dir (a
// directory of the controlplane module or the workspace): read where it is, never copied.
func IstioCRDFile(dir string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/api")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("finding the istio.io/api module (go list -m istio.io/api): %w", err)
	}
	f := filepath.Join(strings.TrimSpace(string(out)), "kubernetes", "customresourcedefinitions.gen.yaml")
	if _, err := os.Stat(f); err != nil {
		return "", fmt.Errorf("Istio CRD file: %w", err)
	}
	return f, nil
}

// CRDs returns the documents of Istio's CRD file (its text, unchanged) that define the kinds
// named, in that order. A kind the file does not define is an error.
func CRDs(istioCRDs []byte, kinds []string) ([]byte, error) {
	docs := map[string][]byte{} // by kind
	for _, doc := range bytes.Split(istioCRDs, []byte("\n---\n")) {
		var crd struct {
			Kind string `json:"kind"`
			Spec struct {
				Names struct {
					Kind string `json:"kind"`
				} `json:"names"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(doc, &crd); err != nil {
			return nil, fmt.Errorf("Istio CRD file: %w", err)
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		if docs[crd.Spec.Names.Kind] != nil {
			return nil, fmt.Errorf("Istio CRD file defines kind %s twice", crd.Spec.Names.Kind)
		}
		docs[crd.Spec.Names.Kind] = bytes.TrimSpace(doc)
	}
	var out bytes.Buffer
	for _, kind := range kinds {
		doc := docs[kind]
		if doc == nil {
			return nil, fmt.Errorf("Istio CRD file defines no CRD of kind %q", kind)
		}
		if bytes.HasPrefix(doc, []byte("---")) {
			doc = bytes.TrimSpace(bytes.TrimPrefix(doc, []byte("---")))
		}
		out.WriteString("---\n")
		out.Write(doc)
		out.WriteString("\n")
	}
	return out.Bytes(), nil
}

// ServedKinds are the Istio kinds discovery watches, whose CRDs Write installs.
func ServedKinds() []string {
	var out []string
	for _, k := range kube.DefaultIstioKinds() {
		out = append(out, string(k))
	}
	return out
}

// Options change what Write writes.
type Options struct {
	// Image is the discovery image; default DefaultImage.
	Image string
}

// Write writes the CRDs of ServedKinds from istioCRDs (Istio's CRD file) as CRDFile and the
// manifests beside it into dir, after removing the YAML files dir held (it is generated).
func Write(dir string, istioCRDs []byte, opts Options) error {
	crds, err := CRDs(istioCRDs, ServedKinds())
	if err != nil {
		return err
	}
	ms, err := Manifests()
	if err != nil {
		return err
	}
	if opts.Image != "" && opts.Image != DefaultImage {
		if ms, err = withImage(ms, opts.Image); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	ms = append(ms, Manifest{Name: CRDFile, Data: crds})
	for _, m := range ms {
		if err := os.WriteFile(filepath.Join(dir, m.Name), m.Data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// withImage names image in place of DefaultImage, which exactly one manifest line holds.
func withImage(ms []Manifest, image string) ([]Manifest, error) {
	line := []byte("image: " + DefaultImage + "\n")
	found := 0
	out := slices.Clone(ms)
	for i, m := range out {
		if n := bytes.Count(m.Data, line); n > 0 {
			found += n
			out[i].Data = bytes.ReplaceAll(m.Data, line, []byte("image: "+image+"\n"))
		}
	}
	if found != 1 {
		return nil, fmt.Errorf("the manifests name the image %s %d times, want once", DefaultImage, found)
	}
	return out, nil
}
