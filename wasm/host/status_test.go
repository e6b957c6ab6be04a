package host

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A callback's return value reads as proxy-wasm-cpp-host and Envoy read it for the
// callback's kind.
func TestFilterStatusByKind(t *testing.T) {
	for _, tc := range []struct {
		kind  callbackKind
		ret   uint64
		allow bool
		want  FilterStatus
	}{
		{kindHeaders, 0, false, StatusContinue},
		{kindHeaders, 2, false, StatusContinue}, // ContinueAndEndStream
		{kindHeaders, 1, false, HeadersStopAllIterationAndWatermark},
		{kindHeaders, 1, true, HeadersStopIteration},
		{kindHeaders, 3, false, HeadersStopAllIterationAndBuffer},
		{kindHeaders, 4, true, HeadersStopAllIterationAndWatermark},
		{kindHeaders, 9, false, HeadersStopAllIterationAndWatermark},
		{kindData, 0, false, StatusContinue},
		{kindData, 1, false, DataStopIterationAndBuffer},
		{kindData, 2, false, DataStopIterationAndWatermark},
		{kindData, 3, false, DataStopIterationNoBuffer},
		{kindData, 7, false, DataStopIterationNoBuffer},
		{kindTrailers, 0, false, StatusContinue},
		{kindTrailers, 1, false, TrailersStopIteration},
		{kindTrailers, 2, false, TrailersStopIteration},
		{kindConnection, 2, false, TrailersStopIteration},
	} {
		t.Run(fmt.Sprintf("kind%d/%d/allow=%t", tc.kind, tc.ret, tc.allow), func(t *testing.T) {
			assert.Equal(t, tc.want, tc.kind.status(tc.ret, tc.allow))
		})
	}
	assert.Equal(t, HeadersStopAllIterationAndWatermark, kindHeaders.stop())
	assert.Equal(t, DataStopIterationNoBuffer, kindData.stop())
	assert.Equal(t, TrailersStopIteration, kindTrailers.stop())
}

// Through a real guest: Pause from the headers stops everything unless the plugin allows
// StopIteration; a local reply stops whatever the guest returned, though Action keeps what
// it returned; failing closed stops too.
func TestResultStatus(t *testing.T) {
	for _, tc := range []struct {
		op     string
		allow  bool
		action Action
		status FilterStatus
	}{
		{"add-header", false, Continue, StatusContinue},
		{"pause", false, Pause, HeadersStopAllIterationAndWatermark},
		{"pause", true, Pause, HeadersStopIteration},
		{"local-continue", true, Continue, HeadersStopAllIterationAndWatermark},
		{"trap", false, Pause, HeadersStopAllIterationAndWatermark},
	} {
		t.Run(fmt.Sprintf("%s/allow=%t", tc.op, tc.allow), func(t *testing.T) {
			f := newFixture(t, "kitchen", PluginConfig{AllowOnHeadersStopIteration: tc.allow}, Environment{})
			res, _ := f.op(t, tc.op)
			assert.Equal(t, tc.action, res.Action)
			assert.Equal(t, tc.status, res.Status)
		})
	}

	// The body callbacks: buffer-body stops with StopIterationAndBuffer until the end.
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	ctx := context.Background()
	s, _, _ := f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "buffer-body"})
	defer s.Finish(ctx)
	res := s.OnRequestBody(ctx, []byte("a"), false)
	assert.Equal(t, DataStopIterationAndBuffer, res.Status)
	res = s.OnRequestBody(ctx, []byte("b"), true)
	assert.Equal(t, StatusContinue, res.Status)
	assert.Equal(t, "AB", string(res.Body))
}
