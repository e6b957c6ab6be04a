package inject

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/dirwatch"

	"github.com/prometheus/client_golang/prometheus"
	meshconfig "istio.io/api/mesh/v1alpha1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Path is where istiod serves injection, and where the MutatingWebhookConfiguration points.
const Path = "/inject"

// WebhookOptions configure a Webhook.
type WebhookOptions struct {
	// Config is the injector's configuration (DefaultConfig when nil).
	Config *Config
	// Mesh is the mesh config in force, read at every request (its defaultConfig is the
	// proxies' ProxyConfig); nil: the defaults.
	Mesh func() *meshconfig.MeshConfig
	// Native says whether the proxy is a native sidecar when neither the values nor the pod
	// say (Istio's ENABLE_NATIVE_SIDECARS, auto detection resolved); nil: not.
	Native func() bool
	Log    *slog.Logger
	// Registerer takes istiod's sidecar_injection_* counters and the latency histogram (nil:
	// not registered).
	Registerer prometheus.Registerer
}

// Webhook is the /inject handler's logic: it injects the pods the API server sends it and
// answers with a JSON patch. A pod that cannot be injected as it asks (a bad annotation) is
// refused with a message naming what is wrong; a pod left alone is allowed unchanged.
type Webhook struct {
	cfg      atomic.Pointer[Config]
	mesh     func() *meshconfig.MeshConfig
	native   func() bool
	log      *slog.Logger
	requests prometheus.Counter
	success  prometheus.Counter
	skipped  prometheus.Counter
	failed   *prometheus.CounterVec
	latency  prometheus.Histogram
	reloads  *prometheus.CounterVec
}

// NewWebhook returns the injection webhook's logic; serve its Admit on Path.
func NewWebhook(opts WebhookOptions) (*Webhook, error) {
	if opts.Config == nil {
		opts.Config = DefaultConfig()
	}
	if opts.Mesh == nil {
		opts.Mesh = func() *meshconfig.MeshConfig { return nil }
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Native == nil {
		opts.Native = func() bool { return false }
	}
	w := &Webhook{mesh: opts.Mesh, native: opts.Native, log: opts.Log.With("scope", "injection"),
		requests: prometheus.NewCounter(prometheus.CounterOpts{Name: "sidecar_injection_requests_total", Help: "Total number of sidecar injection requests."}),
		success:  prometheus.NewCounter(prometheus.CounterOpts{Name: "sidecar_injection_success_total", Help: "Total number of successful sidecar injection requests."}),
		skipped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "sidecar_injection_skip_total", Help: "Total number of skipped sidecar injection requests."}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidecar_injection_failure_total", Help: "Total number of failed sidecar injection requests."},
			[]string{"type"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "wasmesh_injector_config_reloads_total",
			Help: "Reloads of the injector's configuration from its directory, by result (applied, rejected)."}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sidecar_injection_time_seconds", Help: "Time to inject a pod, from the request's decoding to its patch.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}}),
	}
	w.cfg.Store(opts.Config)
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{w.requests, w.success, w.skipped, w.failed, w.latency, w.reloads} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("injection metrics: %w", err)
			}
		}
	}
	return w, nil
}

// SetConfig replaces the injector's configuration from the next request on.
func (w *Webhook) SetConfig(c *Config) { w.cfg.Store(c) }

// Admit injects the pod of a create request (dry runs alike). Other kinds and operations
// are allowed unchanged: the webhook configuration sends only pod creations.
func (w *Webhook) Admit(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	start := time.Now()
	w.requests.Inc()
	allow := &admissionv1.AdmissionResponse{Allowed: true}
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.Operation != admissionv1.Create {
		w.skipped.Inc()
		return allow
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		w.failed.WithLabelValues("decode").Inc()
		return deny(http.StatusBadRequest, fmt.Sprintf("sidecar injection: the pod does not decode: %v", err))
	}
	ns := req.Namespace
	res, err := Inject(w.cfg.Load(), w.mesh(), Input{Pod: &pod, Namespace: ns, Workload: WorkloadOfPod(&pod), NativeSidecars: w.native()})
	name := podName(&pod)
	if err != nil {
		w.failed.WithLabelValues("inject").Inc()
		w.log.Warn("pod refused", "pod", ns+"/"+name, "error", err)
		return deny(http.StatusUnprocessableEntity, "sidecar injection of pod "+ns+"/"+name+": "+err.Error())
	}
	allow.Warnings = res.Warnings
	if res.Pod == nil {
		w.skipped.Inc()
		w.log.Debug("pod not injected", "pod", ns+"/"+name, "reason", res.Skipped)
		return allow
	}
	patch, err := podPatch(&pod, res.Pod)
	if err != nil {
		w.failed.WithLabelValues("patch").Inc()
		return deny(http.StatusInternalServerError, "sidecar injection of pod "+ns+"/"+name+": "+err.Error())
	}
	pt := admissionv1.PatchTypeJSONPatch
	allow.Patch, allow.PatchType = patch, &pt
	w.success.Inc()
	w.latency.Observe(time.Since(start).Seconds())
	w.log.Debug("pod injected", "pod", ns+"/"+name)
	return allow
}

// podName is the pod's name, or its generateName with "*" (a ReplicaSet's pods have no
// name yet when they are created).
func podName(pod *corev1.Pod) string {
	if pod.Name != "" {
		return pod.Name
	}
	return pod.GenerateName + "*"
}

func deny(code int32, msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: msg,
		Reason: metav1.StatusReasonInvalid}}
}

// podPatch is the JSON patch (RFC 6902) from the pod to the injected pod: one operation per
// field of metadata and spec that differs (add, replace or remove), so that nothing
// injection did not touch is rewritten. Both sides are compared as Go writes them, so that
// the API server's spelling of an unchanged field (an omitted creationTimestamp) is no
// change.
func podPatch(original, injected *corev1.Pod) ([]byte, error) {
	var from, to map[string]json.RawMessage
	for _, side := range []struct {
		pod *corev1.Pod
		out *map[string]json.RawMessage
	}{{original, &from}, {injected, &to}} {
		b, err := json.Marshal(side.pod)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, side.out); err != nil {
			return nil, err
		}
	}
	var ops []patchOp
	for _, part := range []string{"metadata", "spec"} {
		var a, b map[string]json.RawMessage
		if raw, ok := from[part]; ok {
			if err := json.Unmarshal(raw, &a); err != nil {
				return nil, fmt.Errorf("%s: %w", part, err)
			}
		}
		if err := json.Unmarshal(to[part], &b); err != nil {
			return nil, fmt.Errorf("%s: %w", part, err)
		}
		if a == nil {
			ops = append(ops, patchOp{Op: "add", Path: "/" + part, Value: to[part]})
			continue
		}
		ops = append(ops, fieldOps("/"+part+"/", a, b)...)
	}
	return json.Marshal(ops)
}

type patchOp struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value,omitempty"`
}

// fieldOps are the operations turning object a into b, field by field (keys sorted).
func fieldOps(prefix string, a, b map[string]json.RawMessage) []patchOp {
	var ops []patchOp
	for _, k := range sortedKeys(b) {
		old, ok := a[k]
		switch {
		case !ok:
			ops = append(ops, patchOp{Op: "add", Path: prefix + escapePointer(k), Value: b[k]})
		case !bytes.Equal(old, b[k]): // both sides as json.Marshal writes them
			ops = append(ops, patchOp{Op: "replace", Path: prefix + escapePointer(k), Value: b[k]})
		}
	}
	for _, k := range sortedKeys(a) {
		if _, ok := b[k]; !ok {
			ops = append(ops, patchOp{Op: "remove", Path: prefix + escapePointer(k)})
		}
	}
	return ops
}

// escapePointer escapes a key for a JSON pointer (RFC 6901).
var escapePointer = strings.NewReplacer("~", "~0", "/", "~1").Replace

// WatchConfig reloads the configuration from dir (LoadConfig's files) whenever it changes,
// until ctx ends: a configuration that does not load is logged and the last good one stays.
func (w *Webhook) WatchConfig(ctx context.Context, dir string) error {
	return dirwatch.Run(ctx, dir, w.log, func() {
		c, err := LoadConfig(dir)
		if err != nil {
			w.reloads.WithLabelValues("rejected").Inc()
			w.log.Warn("injector configuration not reloaded; the last good one stays", "error", err)
			return
		}
		w.SetConfig(c)
		w.reloads.WithLabelValues("applied").Inc()
	})
}
