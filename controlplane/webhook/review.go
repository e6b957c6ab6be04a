package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AdmitFunc decides one admission request. The server answers with its response under the
// request's UID; nil allows.
type AdmitFunc func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse

// maxBodyBytes bounds a request as istiod does (kube.MaxRequestBodyBytes): twice the API
// server's own limit on an object, itself twice etcd's.
const maxBodyBytes = 6 << 20

// reviewAPIVersion is the only AdmissionReview version served: the webhook configurations
// ask for it (admissionReviewVersions: ["v1"]), as istiod's do.
var reviewAPIVersion = admissionv1.SchemeGroupVersion.String()

// reviewHandler serves AdmissionReviews with admit. A request that is not one (no body, not
// JSON, another version, no request or UID) is a 400 naming what is wrong, not a denial: the
// API server then applies the webhook's failurePolicy. A panicking admit is a 500.
func reviewHandler(path string, admit AdmitFunc, log *slog.Logger, requests *prometheus.CounterVec) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, resp, err := review(r, admit)
		requests.WithLabelValues(path, strconv.Itoa(code)).Inc()
		if err != nil {
			log.Warn("bad admission request", "path", path, "code", code, "remote", r.RemoteAddr, "error", err)
			http.Error(w, err.Error(), code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(resp)
	})
}

// review reads one AdmissionReview, admits it and encodes the answer; a failure returns its
// HTTP status.
func review(r *http.Request, admit AdmitFunc) (code int, out []byte, err error) {
	if r.Method != http.MethodPost {
		return http.StatusMethodNotAllowed, nil, fmt.Errorf("method %s: want POST", r.Method)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return http.StatusUnsupportedMediaType, nil, fmt.Errorf("Content-Type %q: want application/json", r.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil {
		return http.StatusBadRequest, nil, fmt.Errorf("reading the body: %w", err)
	}
	if len(body) > maxBodyBytes {
		return http.StatusRequestEntityTooLarge, nil, fmt.Errorf("body over %d bytes", maxBodyBytes)
	}
	req, err := decodeReview(body)
	if err != nil {
		return http.StatusBadRequest, nil, err
	}
	resp, err := safeAdmit(r.Context(), admit, req)
	if err != nil {
		return http.StatusInternalServerError, nil, err
	}
	if resp == nil {
		resp = &admissionv1.AdmissionResponse{Allowed: true}
	}
	resp.UID = req.UID
	out, err = json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: reviewAPIVersion, Kind: "AdmissionReview"},
		Response: resp,
	})
	if err != nil {
		return http.StatusInternalServerError, nil, fmt.Errorf("encoding the response: %w", err)
	}
	return http.StatusOK, out, nil
}

func decodeReview(body []byte) (*admissionv1.AdmissionRequest, error) {
	if len(body) == 0 {
		return nil, errors.New("no body: want an AdmissionReview")
	}
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &ar); err != nil {
		return nil, fmt.Errorf("not an AdmissionReview: %w", err)
	}
	if ar.APIVersion != reviewAPIVersion || ar.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("apiVersion %q, kind %q: want %s AdmissionReview", ar.APIVersion, ar.Kind, reviewAPIVersion)
	}
	if ar.Request == nil {
		return nil, errors.New("AdmissionReview without a request")
	}
	if ar.Request.UID == "" {
		return nil, errors.New("AdmissionReview request without a uid")
	}
	return ar.Request, nil
}

// safeAdmit turns a panic of admit into an error: bad input never takes the server down.
func safeAdmit(ctx context.Context, admit AdmitFunc, req *admissionv1.AdmissionRequest) (resp *admissionv1.AdmissionResponse, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("admitting %s %s/%s: panic: %v", req.Kind.Kind, req.Namespace, req.Name, p)
		}
	}()
	return admit(ctx, req), nil
}
