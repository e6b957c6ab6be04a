package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newValidateHandler(t *testing.T) (http.Handler, *Validator, *prometheus.CounterVec) {
	t.Helper()
	v, err := NewValidator(quiet, prometheus.NewRegistry())
	require.NoError(t, err)
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r"}, []string{"path", "code"})
	return reviewHandler(ValidatePath, v.Admit, quiet, requests), v, requests
}

const invalidVS = `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"bad","namespace":"demo"},
"spec":{"hosts":["backend.demo.svc.cluster.local"],"http":[{"route":[{"destination":{"host":"backend.demo.svc.cluster.local"},"weight":-5}]}]}}`

const validVS = `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"good","namespace":"demo"},
"spec":{"hosts":["backend.demo.svc.cluster.local"],"http":[{"route":[{"destination":{"host":"backend.demo.svc.cluster.local"}}]}]}}`

func request(op admissionv1.Operation, group, kind, object string) *admissionv1.AdmissionRequest {
	var raw []byte
	if object != "" {
		raw = []byte(object)
	}
	return &admissionv1.AdmissionRequest{
		UID: types.UID("uid-" + strings.ToLower(kind)), Operation: op, Namespace: "demo",
		Kind:     metav1.GroupVersionKind{Group: group, Version: "v1", Kind: kind},
		Resource: metav1.GroupVersionResource{Group: group, Version: "v1", Resource: strings.ToLower(kind) + "s"},
		Object:   runtime.RawExtension{Raw: raw},
	}
}

func post(t *testing.T, h http.Handler, contentType string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, ValidatePath, bytes.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func reviewOf(t *testing.T, req *admissionv1.AdmissionRequest) []byte {
	t.Helper()
	b, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	require.NoError(t, err)
	return b
}

// answer posts an AdmissionReview and decodes the answer, which must be a 200 with the
// request's UID.
func answer(t *testing.T, h http.Handler, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	w := post(t, h, "application/json", reviewOf(t, req))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var out admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out))
	assert.Equal(t, "admission.k8s.io/v1", out.APIVersion)
	assert.Equal(t, "AdmissionReview", out.Kind)
	require.NotNil(t, out.Response)
	assert.Equal(t, req.UID, out.Response.UID, "the answer carries the request's UID")
	return out.Response
}

// The message of a refusal is the one the Kubernetes source gives the same object:
// config.FromObject's, naming the object and the field.
func TestValidateRefusesWhatTheSourcesRejectWithTheirMessage(t *testing.T) {
	h, _, _ := newValidateHandler(t)
	var obj object
	require.NoError(t, json.Unmarshal([]byte(invalidVS), &obj))
	_, want := config.FromObject("kubernetes: VirtualService demo/bad", config.Object{Kind: obj.Kind, APIVersion: obj.APIVersion,
		Name: "bad", Namespace: "demo", Spec: obj.Spec})
	require.NotNil(t, want)

	for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
		resp := answer(t, h, request(op, "networking.istio.io", "VirtualService", invalidVS))
		assert.False(t, resp.Allowed, op)
		require.NotNil(t, resp.Result, op)
		assert.Equal(t, "configuration is invalid: "+want.Error(), resp.Result.Message, op)
		assert.Contains(t, resp.Result.Message, "spec.http[0].route[0].weight", op)
	}
	assert.True(t, answer(t, h, request(admissionv1.Create, "networking.istio.io", "VirtualService", validVS)).Allowed)
}

func TestValidateCases(t *testing.T) {
	withField := strings.Replace(validVS, `"spec":`, `"extra":{},"spec":`, 1)
	noNamespace := strings.Replace(invalidVS, `,"namespace":"demo"`, "", 1)
	for _, tc := range []struct {
		name    string
		req     *admissionv1.AdmissionRequest
		allowed bool
		message string
	}{
		{"delete of anything", request(admissionv1.Delete, "networking.istio.io", "VirtualService", ""), true, ""},
		{"connect", request(admissionv1.Connect, "networking.istio.io", "VirtualService", invalidVS), true, ""},
		{"a kind wasmesh does not know", request(admissionv1.Create, "networking.istio.io", "Frobnicator", `{"spec":{"x":1}}`), true, ""},
		{"a known kind name in another group", request(admissionv1.Create, "example.com", "VirtualService", invalidVS), true, ""},
		{"dry run: judged alike", func() *admissionv1.AdmissionRequest {
			r := request(admissionv1.Create, "networking.istio.io", "VirtualService", invalidVS)
			r.DryRun = ptr.To(true)
			return r
		}(), false, "spec.http[0].route[0].weight"},
		{"object that is not an object", request(admissionv1.Create, "networking.istio.io", "VirtualService", `[1,2]`), false, "cannot decode configuration"},
		{"unknown top-level field", request(admissionv1.Create, "networking.istio.io", "VirtualService", withField), false,
			`unknown field "extra" on VirtualService resource demo/good`},
		{"namespace from the request", request(admissionv1.Create, "networking.istio.io", "VirtualService", noNamespace), false,
			"kubernetes: VirtualService demo/bad: spec.http[0].route[0].weight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _, _ := newValidateHandler(t)
			resp := answer(t, h, tc.req)
			assert.Equal(t, tc.allowed, resp.Allowed)
			if tc.message != "" {
				require.NotNil(t, resp.Result)
				assert.Contains(t, resp.Result.Message, tc.message)
			}
		})
	}
}

// A dry run refused is not counted as a failure, as istiod counts; a real one is.
func TestValidateCountsAsIstiod(t *testing.T) {
	h, v, _ := newValidateHandler(t)
	dry := request(admissionv1.Create, "networking.istio.io", "VirtualService", invalidVS)
	dry.DryRun = ptr.To(true)
	answer(t, h, dry)
	assert.Equal(t, 0, testutil.CollectAndCount(v.failed))
	answer(t, h, request(admissionv1.Create, "networking.istio.io", "VirtualService", invalidVS))
	assert.Equal(t, 1.0, testutil.ToFloat64(v.failed.WithLabelValues("networking.istio.io", "v1", "virtualservices", "invalid_resource")))
	answer(t, h, request(admissionv1.Create, "networking.istio.io", "VirtualService", validVS))
	assert.Equal(t, 1.0, testutil.ToFloat64(v.passed.WithLabelValues("networking.istio.io", "v1", "virtualservices")))
}

// What is not an AdmissionReview is a 4xx naming what is wrong, never a denial or a panic.
func TestMalformedReviews(t *testing.T) {
	noUID := request(admissionv1.Create, "networking.istio.io", "VirtualService", validVS)
	noUID.UID = ""
	for _, tc := range []struct {
		name, contentType string
		body              []byte
		code              int
		message           string
	}{
		{"empty body", "application/json", nil, http.StatusBadRequest, "no body"},
		{"not JSON", "application/json", []byte(`{"apiVersion":`), http.StatusBadRequest, "not an AdmissionReview"},
		{"JSON of another shape", "application/json", []byte(`[1,2]`), http.StatusBadRequest, "not an AdmissionReview"},
		{"v1beta1", "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"1"}}`),
			http.StatusBadRequest, `apiVersion "admission.k8s.io/v1beta1"`},
		{"no request", "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), http.StatusBadRequest, "without a request"},
		{"no uid", "application/json", reviewOf(t, noUID), http.StatusBadRequest, "without a uid"},
		{"not JSON content", "text/plain", reviewOf(t, noUID), http.StatusUnsupportedMediaType, "want application/json"},
		{"no content type", "", []byte(`{}`), http.StatusUnsupportedMediaType, "want application/json"},
		{"too large", "application/json", bytes.Repeat([]byte(" "), maxBodyBytes+1), http.StatusRequestEntityTooLarge, "body over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _, requests := newValidateHandler(t)
			w := post(t, h, tc.contentType, tc.body)
			assert.Equal(t, tc.code, w.Code)
			assert.Contains(t, w.Body.String(), tc.message)
			assert.Equal(t, 1.0, testutil.ToFloat64(requests.WithLabelValues(ValidatePath, strconv.Itoa(tc.code))))
		})
	}
	h, _, _ := newValidateHandler(t)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, ValidatePath, nil))
	assert.Equal(t, http.StatusMethodNotAllowed, w.Code)
}

// A handler that panics answers 500; the server goes on.
func TestPanickingHandlerIs500(t *testing.T) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r"}, []string{"path", "code"})
	h := reviewHandler("/boom", func(context.Context, *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		panic("bad input")
	}, quiet, requests)
	w := post(t, h, "application/json", reviewOf(t, request(admissionv1.Create, "networking.istio.io", "VirtualService", validVS)))
	assert.Equal(t, http.StatusInternalServerError, w.Code)
	assert.Contains(t, w.Body.String(), "panic: bad input")
}
