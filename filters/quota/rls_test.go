//go:build !wasip1

// The hand-written RateLimitRequest encoder and RateLimitResponse decoder against
// go-control-plane's generated types: the same bytes as proto.Marshal, and the same
// values as proto.Unmarshal. Test-only imports; the filter itself has no protobuf runtime.

package main

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
)

func encodeRequest(domain string, descriptors [][]ratelimit.Entry, hits uint32) []byte {
	var r rlsRequest
	r.start(domain)
	for _, d := range descriptors {
		r.addDescriptor(d)
	}
	return r.finish(hits)
}

func protoRequest(domain string, descriptors [][]ratelimit.Entry, hits uint32) *rlsv3.RateLimitRequest {
	m := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, d := range descriptors {
		pd := &commonrl.RateLimitDescriptor{}
		for _, e := range d {
			pd.Entries = append(pd.Entries, &commonrl.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		m.Descriptors = append(m.Descriptors, pd)
	}
	return m
}

func TestRateLimitRequestIsWhatProtoMarshals(t *testing.T) {
	long := strings.Repeat("v", 300) // lengths past one varint byte, in the entry and descriptor
	for name, tc := range map[string]struct {
		domain      string
		descriptors [][]ratelimit.Entry
		hits        uint32
	}{
		"one entry":      {"mesh", [][]ratelimit.Entry{{{Key: "user", Value: "alice"}}}, 1},
		"several":        {"mesh", [][]ratelimit.Entry{{{Key: "generic_key", Value: "front"}}, {{Key: "user", Value: "bob"}, {Key: "path", Value: "/api/"}}}, 1},
		"long values":    {"mesh", [][]ratelimit.Entry{{{Key: "k", Value: long}, {Key: long, Value: "é✓"}}}, 1},
		"empty value":    {"mesh", [][]ratelimit.Entry{{{Key: "k", Value: ""}}}, 1},
		"big hits":       {"d", [][]ratelimit.Entry{{{Key: "k", Value: "v"}}}, 1 << 31},
		"no descriptors": {"d", nil, 1},
	} {
		t.Run(name, func(t *testing.T) {
			got := encodeRequest(tc.domain, tc.descriptors, tc.hits)
			want := protoRequest(tc.domain, tc.descriptors, tc.hits)
			wantBytes, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
			require.NoError(t, err)
			assert.Equal(t, wantBytes, got, "canonical encoding")
			var back rlsv3.RateLimitRequest
			require.NoError(t, proto.Unmarshal(got, &back))
			assert.True(t, proto.Equal(want, &back), "decodes to %v", &back)
		})
	}
}

// The buffer is reused between requests: a shorter request after a longer one leaves
// nothing of it behind.
func TestRateLimitRequestBufferReuse(t *testing.T) {
	var r rlsRequest
	r.start("a-long-domain-name")
	r.addDescriptor([]ratelimit.Entry{{Key: "user", Value: strings.Repeat("x", 200)}})
	r.finish(1)
	r.start("d")
	r.addDescriptor([]ratelimit.Entry{{Key: "k", Value: "v"}})
	got := r.finish(1)
	want, err := proto.Marshal(protoRequest("d", [][]ratelimit.Entry{{{Key: "k", Value: "v"}}}, 1))
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

func TestGrpcServiceIsWhatProtoMarshals(t *testing.T) {
	for _, tc := range [][2]string{{"outbound|8081||ratelimit.default.svc.cluster.local", ""},
		{"rls", "ratelimit.default.svc.cluster.local"}, {strings.Repeat("c", 200), strings.Repeat("a", 130)}} {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(&corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
			EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: tc[0], Authority: tc[1]}}})
		require.NoError(t, err)
		assert.Equal(t, want, appendGrpcService(nil, tc[0], tc[1]), "%q", tc)
	}
}

func TestRateLimitResponseDecodes(t *testing.T) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "front", RequestsPerUnit: 100,
					Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, UnitMultiplier: wrapperspb.UInt32(2)},
				LimitRemaining:     42,
				DurationUntilReset: durationpb.New(1500 * time.Millisecond)},
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
				DurationUntilReset: durationpb.New(300 * time.Millisecond),
				Quota:              &rlsv3.RateLimitResponse_Quota{Requests: 7, Id: "q"}},
			{Code: rlsv3.RateLimitResponse_OK}, // a descriptor the service has no limit for
		},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-from-service", Value: "1"}, {Key: "x-raw", RawValue: []byte("raw")}},
		RequestHeadersToAdd:  []*corev3.HeaderValue{{Key: "x-upstream-note", Value: "over"}},
		// Fields the filter does not use, skipped as unknown.
		RawBody:         []byte("body"),
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewNumberValue(1.5)}},
	}
	b, err := proto.Marshal(resp)
	require.NoError(t, err)
	got, err := parseRateLimitResponse(b)
	require.NoError(t, err)
	assert.Equal(t, &rlsResponse{
		overall: rlsOverLimit,
		statuses: []rlsStatus{
			{code: rlsOK, hasLimit: true, limit: 100, unit: 2, remaining: 42, reset: 1500 * time.Millisecond},
			{code: rlsOverLimit, hasLimit: true, limit: 5, unit: 1, reset: 300 * time.Millisecond},
			{code: rlsOK},
		},
		responseHeaders: [][2]string{{"x-from-service", "1"}, {"x-raw", "raw"}},
		requestHeaders:  [][2]string{{"x-upstream-note", "over"}},
	}, got)
}

// Random responses through proto.Marshal decode to what they hold.
func TestRateLimitResponseRandomRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 7))
	for i := range 500 {
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(rng.IntN(3))}
		want := &rlsResponse{overall: uint32(resp.OverallCode)}
		for range rng.IntN(4) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(rng.IntN(3)), LimitRemaining: rng.Uint32()}
			ws := rlsStatus{code: uint32(st.Code), remaining: st.LimitRemaining}
			if rng.IntN(2) == 0 {
				st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rng.Uint32(), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(rng.IntN(8))}
				ws.hasLimit, ws.limit, ws.unit = true, st.CurrentLimit.RequestsPerUnit, uint32(st.CurrentLimit.Unit)
			}
			if rng.IntN(2) == 0 {
				d := time.Duration(rng.Int64N(int64(24 * time.Hour)))
				st.DurationUntilReset, ws.reset = durationpb.New(d), d
			}
			resp.Statuses = append(resp.Statuses, st)
			want.statuses = append(want.statuses, ws)
		}
		b, err := proto.Marshal(resp)
		require.NoError(t, err)
		got, err := parseRateLimitResponse(b)
		require.NoError(t, err, "case %d", i)
		require.Equal(t, want, got, "case %d", i)
	}
}

func TestRateLimitResponseErrors(t *testing.T) {
	good, err := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 3}}})
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		in   []byte
		want string
	}{
		"truncated status":      {good[:len(good)-1], "truncated"},
		"truncated varint":      {[]byte{0x08, 0x80}, "truncated"},
		"varint too long":       {[]byte{0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, "overflows"},
		"group wire type":       {[]byte{0x0b}, "wire type 3"},
		"field zero":            {[]byte{0x00, 0x01}, "bad field number 0"},
		"length past the end":   {[]byte{0x12, 0x05, 0x08}, "truncated"},
		"header without key":    {[]byte{0x1a, 0x03, 0x12, 0x01, 'v'}, "header without a key"},
		"truncated fixed64":     {[]byte{0x29, 1, 2, 3}, "truncated"},
		"truncated duration":    {[]byte{0x12, 0x04, 0x22, 0x02, 0x08, 0x80}, "truncated"},
		"status field in error": {[]byte{0x12, 0x02, 0x0b, 0x00}, "field 2: field 1: unsupported wire type 3"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseRateLimitResponse(tc.in)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "RateLimitResponse")
		})
	}
}

func TestProtoDurationEdges(t *testing.T) {
	for _, tc := range []struct {
		d    *durationpb.Duration
		want time.Duration
	}{
		{&durationpb.Duration{Seconds: -5}, 0},
		{&durationpb.Duration{Nanos: -5}, 0},
		{&durationpb.Duration{Seconds: 315576000000}, time.Duration(1<<63 - 1)},
		{&durationpb.Duration{Seconds: 2, Nanos: 1}, 2*time.Second + 1},
	} {
		b, err := proto.Marshal(tc.d)
		require.NoError(t, err)
		got, err := parseProtoDuration(b)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "%v", tc.d)
	}
}
