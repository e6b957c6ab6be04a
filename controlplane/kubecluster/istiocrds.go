package kubecluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// IstioCRDFile is the file of Istio's CustomResourceDefinitions that the istio.io/api
// module this module builds with ships (kubernetes/customresourcedefinitions.gen.yaml),
// found in the module cache with `go list`: it is read where it is, never copied.
func IstioCRDFile() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/api").Output()
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

// InstallIstioCRDs creates the CustomResourceDefinitions of the Istio kinds named
// ("VirtualService", "Telemetry", ...) from IstioCRDFile and waits until the API server
// serves each (established). A kind the file does not define is an error.
func (c *Cluster) InstallIstioCRDs(ctx context.Context, kinds ...string) error {
	file, err := IstioCRDFile()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading Istio CRDs: %w", err)
	}
	crds := map[string]*unstructured.Unstructured{} // by kind
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if kind, _, _ := unstructured.NestedString(obj, "spec", "names", "kind"); kind != "" && u.GetKind() == "CustomResourceDefinition" {
			crds[kind] = u
		}
	}
	client, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	for _, kind := range kinds {
		crd := crds[kind]
		if crd == nil {
			return fmt.Errorf("%s defines no CRD of kind %q (it has %v)", file, kind, slices.Sorted(maps.Keys(crds)))
		}
		if _, err := client.Resource(crdResource).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", crd.GetName(), err)
		}
	}
	for _, kind := range kinds {
		if err := waitEstablished(ctx, client, crds[kind].GetName()); err != nil {
			return err
		}
	}
	return nil
}

// waitEstablished watches the CRD until its Established condition is true.
func waitEstablished(ctx context.Context, client dynamic.Interface, name string) error {
	res := client.Resource(crdResource)
	cur, err := res.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("CRD %s: %w", name, err)
	}
	if established(cur) {
		return nil
	}
	w, err := res.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: cur.GetResourceVersion()})
	if err != nil {
		return fmt.Errorf("watching CRD %s: %w", name, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established: %w", name, ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("CRD %s: watch closed before it was established", name)
			}
			if u, isObj := ev.Object.(*unstructured.Unstructured); isObj && ev.Type != watch.Deleted && established(u) {
				return nil
			}
		}
	}
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
