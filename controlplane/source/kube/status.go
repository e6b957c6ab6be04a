package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	analysisv1alpha1 "istio.io/api/analysis/v1alpha1"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// What a rejected object's status carries, in Istio's shape (meta.v1alpha1.IstioStatus):
// the analysis message Istio reports for a config that fails validation, IST0106
// SchemaValidationError, and a condition saying why the object is not accepted.
const (
	conditionAccepted     = "Accepted"
	reasonSchemaInvalid   = "SchemaValidationError"
	messageCodeSchema     = "IST0106"
	messageDocumentation  = "https://istio.io/latest/docs/reference/config/analysis/ist0106/"
	statusWriteMaxBackoff = 30 * time.Second
)

// StatusWriter writes the outcome of Istio objects back on them (status.conditions and
// status.validationMessages) when it is enabled: only the leader replica writes. It
// writes only where the object's status differs from its outcome: a rejected object gets
// the error, an accepted one loses an error written before, and an object that never
// carried one is left alone. While disabled it remembers what it would write.
type StatusWriter struct {
	log    *slog.Logger
	client istioclient.Interface
	now    func() time.Time

	mu      sync.Mutex
	enabled bool
	pending map[config.Key]statusReport // writes not done yet

	q      workqueue.TypedRateLimitingInterface[config.Key]
	queued atomic.Int64 // writes ever queued (tests: none while disabled)
}

// statusReport is an object's outcome against the status it carries.
type statusReport struct {
	kind            *istioKind
	generation      int64
	resourceVersion string
	current         istioStatus // as cached: read only
	err             string      // "" when accepted
}

func newStatusWriter(log *slog.Logger, client istioclient.Interface, enabled bool) *StatusWriter {
	return &StatusWriter{log: log, client: client, now: time.Now, enabled: enabled, pending: map[config.Key]statusReport{},
		q: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[config.Key](100*time.Millisecond, statusWriteMaxBackoff))}
}

// SetEnabled turns writing on (this replica leads) or off. Turned on, it writes every
// outcome it has been told of that the objects do not carry yet.
func (w *StatusWriter) SetEnabled(on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.enabled = on
	if on {
		for k := range w.pending {
			w.enqueue(k)
		}
	}
}

// report records an object's outcome (err nil: accepted); gone says the object was deleted.
func (w *StatusWriter) report(key config.Key, r statusReport, gone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if gone || !needsWrite(r.current, r.generation, r.err) {
		delete(w.pending, key)
		return
	}
	w.pending[key] = r
	if w.enabled {
		w.enqueue(key)
	}
}

func (w *StatusWriter) enqueue(key config.Key) {
	w.queued.Add(1)
	w.q.Add(key)
}

// run writes statuses until ctx ends.
func (w *StatusWriter) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		w.q.ShutDown()
	}()
	for {
		key, shutdown := w.q.Get()
		if shutdown {
			return
		}
		w.writeOne(ctx, key)
		w.q.Done(key)
	}
}

func (w *StatusWriter) writeOne(ctx context.Context, key config.Key) {
	w.mu.Lock()
	r, ok := w.pending[key]
	enabled := w.enabled
	w.mu.Unlock()
	if !ok || !enabled {
		w.q.Forget(key)
		return
	}
	err := w.write(ctx, key, r)
	switch {
	case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Written, or the object changed or went: its next version brings a new report.
		w.mu.Lock()
		if cur, ok := w.pending[key]; ok && cur.resourceVersion == r.resourceVersion {
			delete(w.pending, key)
		}
		w.mu.Unlock()
		w.q.Forget(key)
	default:
		w.log.Warn("writing Istio config status failed; retrying", "config", key.String(), "error", err)
		w.q.AddRateLimited(key)
	}
}

// write patches the object's status subresource, conditioned on the version reported.
func (w *StatusWriter) write(ctx context.Context, key config.Key, r statusReport) error {
	st := desiredStatus(r.current, r.generation, r.err, w.now())
	js, err := protojson.Marshal(st)
	if err != nil {
		return fmt.Errorf("encoding status of %s: %w", key, err)
	}
	var status map[string]any
	if err := json.Unmarshal(js, &status); err != nil {
		return fmt.Errorf("encoding status of %s: %w", key, err)
	}
	// A merge patch replaces lists whole and keeps fields it does not name: name both.
	for _, f := range []string{"conditions", "validationMessages"} {
		if _, ok := status[f]; !ok {
			status[f] = nil
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": r.resourceVersion}, "status": status})
	if err != nil {
		return fmt.Errorf("encoding status patch of %s: %w", key, err)
	}
	err = r.kind.rest(w.client).Patch(types.MergePatchType).Namespace(key.Namespace).Resource(r.kind.resource).Name(key.Name).
		SubResource("status").Body(patch).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("patching status of %s: %w", key, err)
	}
	return nil
}

// needsWrite reports whether an object's status differs from its outcome (errText ""
// when accepted) in what the writer owns.
func needsWrite(cur istioStatus, generation int64, errText string) bool {
	cond, msg := ownedParts(cur)
	if errText == "" {
		return cond != nil || msg != nil
	}
	return cond == nil || msg == nil || cond.GetMessage() != errText || cond.GetObservedGeneration() != generation
}

// ownedParts finds what the writer writes in a status: its condition and its message.
func ownedParts(st istioStatus) (*metav1alpha1.IstioCondition, *analysisv1alpha1.AnalysisMessageBase) {
	var cond *metav1alpha1.IstioCondition
	var msg *analysisv1alpha1.AnalysisMessageBase
	if st == nil {
		return nil, nil
	}
	for _, c := range st.GetConditions() {
		if c.GetType() == conditionAccepted && c.GetReason() == reasonSchemaInvalid {
			cond = c
		}
	}
	for _, m := range st.GetValidationMessages() {
		if m.GetType().GetCode() == messageCodeSchema {
			msg = m
		}
	}
	return cond, msg
}

// desiredStatus is cur with the writer's parts replaced by the outcome's; what others wrote
// stays.
func desiredStatus(cur istioStatus, generation int64, errText string, now time.Time) *metav1alpha1.IstioStatus {
	if cur == nil {
		cur = &metav1alpha1.IstioStatus{}
	}
	st := &metav1alpha1.IstioStatus{ObservedGeneration: cur.GetObservedGeneration()}
	for _, c := range cur.GetConditions() {
		if !(c.GetType() == conditionAccepted && c.GetReason() == reasonSchemaInvalid) {
			st.Conditions = append(st.Conditions, proto.Clone(c).(*metav1alpha1.IstioCondition))
		}
	}
	for _, m := range cur.GetValidationMessages() {
		if m.GetType().GetCode() != messageCodeSchema {
			st.ValidationMessages = append(st.ValidationMessages, proto.Clone(m).(*analysisv1alpha1.AnalysisMessageBase))
		}
	}
	if errText == "" {
		return st
	}
	st.ObservedGeneration = generation
	st.Conditions = append(st.Conditions, &metav1alpha1.IstioCondition{
		Type: conditionAccepted, Status: "False", Reason: reasonSchemaInvalid, Message: errText,
		ObservedGeneration: generation, LastTransitionTime: timestamppb.New(now),
	})
	st.ValidationMessages = append(st.ValidationMessages, &analysisv1alpha1.AnalysisMessageBase{
		Type:             &analysisv1alpha1.AnalysisMessageBase_Type{Name: reasonSchemaInvalid, Code: messageCodeSchema},
		Level:            analysisv1alpha1.AnalysisMessageBase_ERROR,
		DocumentationUrl: messageDocumentation,
	})
	return st
}
