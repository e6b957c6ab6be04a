package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// ValidatePath is where istiod serves validation, and where webhook configurations point.
const ValidatePath = "/validate"

// Reasons of a refused object, as istiod's galley_validation_failed labels them.
const (
	reasonDecodeError  = "yaml_decode_error"
	reasonInvalidField = "invalid_resource"
)

// Validator admits Istio objects with the code the directory and Kubernetes sources read
// them with (config.FromObject): an object either source would reject is refused with the
// same message, naming the field. Only creates and updates are judged, dry runs alike;
// deletes and kinds wasmesh does not know pass.
type Validator struct {
	log    *slog.Logger
	passed *prometheus.CounterVec
	failed *prometheus.CounterVec
}

// NewValidator returns the /validate handler's logic; reg takes istiod's
// galley_validation_* counters (nil: not registered).
func NewValidator(log *slog.Logger, reg prometheus.Registerer) (*Validator, error) {
	if log == nil {
		log = slog.Default()
	}
	v := &Validator{
		log: log.With("scope", "validation"),
		passed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "galley_validation_passed", Help: "Resource is valid"},
			[]string{"group", "version", "resource"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "galley_validation_failed", Help: "Resource validation failed"},
			[]string{"group", "version", "resource", "reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{v.passed, v.failed} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("validation metrics: %w", err)
			}
		}
	}
	return v, nil
}

// object is an Istio object as the API server sends it in an AdmissionRequest.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

// topLevelFields are the fields istiod accepts at the top of an Istio object.
var topLevelFields = []string{"apiVersion", "kind", "metadata", "spec", "status"}

// Admit is the AdmitFunc of ValidatePath.
func (v *Validator) Admit(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return allowed()
	}
	if !knownKind(req.Kind) {
		// Istio objects of kinds wasmesh does not read (or anything a broad rule sends) are
		// not wasmesh's to refuse.
		v.log.Debug("not validated: kind unknown", "group", req.Kind.Group, "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name)
		return allowed()
	}
	dryRun := req.DryRun != nil && *req.DryRun
	deny := func(reason string, err error) *admissionv1.AdmissionResponse {
		v.log.Info("configuration refused", "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name,
			"operation", req.Operation, "dryRun", dryRun, "error", err)
		if !dryRun { // as istiod: a dry run does not count as a failure
			v.failed.WithLabelValues(req.Resource.Group, req.Resource.Version, req.Resource.Resource, reason).Inc()
		}
		return &admissionv1.AdmissionResponse{Result: &metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}}
	}
	var obj object
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return deny(reasonDecodeError, fmt.Errorf("cannot decode configuration: %w", err))
	}
	if obj.Metadata.Namespace == "" {
		obj.Metadata.Namespace = req.Namespace
	}
	if obj.Metadata.Name == "" {
		obj.Metadata.Name = req.Name
	}
	key := config.Key{Kind: config.Kind(obj.Kind), Namespace: obj.Metadata.Namespace, Name: obj.Metadata.Name}
	if _, cerr := config.FromObject(ObjectSource(key), config.Object{
		Kind: obj.Kind, APIVersion: obj.APIVersion, Name: obj.Metadata.Name, Namespace: obj.Metadata.Namespace,
		Labels: obj.Metadata.Labels, Annotations: obj.Metadata.Annotations, Spec: obj.Spec,
	}); cerr != nil {
		return deny(reasonInvalidField, fmt.Errorf("configuration is invalid: %w", cerr))
	}
	if err := checkTopLevelFields(req.Object.Raw, key); err != nil {
		return deny(reasonInvalidField, err)
	}
	v.passed.WithLabelValues(req.Resource.Group, req.Resource.Version, req.Resource.Resource).Inc()
	return allowed()
}

func allowed() *admissionv1.AdmissionResponse { return &admissionv1.AdmissionResponse{Allowed: true} }

// ObjectSource names an object in messages as the Kubernetes source names it (its
// Meta.Source and the status it writes), so that a refusal and a status say the same.
func ObjectSource(k config.Key) string {
	return "kubernetes: " + string(k.Kind) + " " + k.Namespace + "/" + k.Name
}

// knownKind: a kind of an Istio group that the config package reads.
func knownKind(gvk metav1.GroupVersionKind) bool {
	return strings.HasSuffix(gvk.Group, ".istio.io") && slices.Contains(config.Kinds(), config.Kind(gvk.Kind))
}

// checkTopLevelFields refuses fields beside the object's envelope and spec, as istiod does:
// they would be dropped without a word.
func checkTopLevelFields(raw []byte, key config.Key) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return fmt.Errorf("cannot decode configuration fields: %w", err)
	}
	for f := range fields {
		if !slices.Contains(topLevelFields, f) {
			return fmt.Errorf("unknown field %q on %s resource %s/%s", f, key.Kind, key.Namespace, key.Name)
		}
	}
	return nil
}
