package harness

import (
	"context"
	"errors"
	"time"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// GRPCCallHandler decides how the service of a gRPC call answers. It runs at dispatch, so
// it may compute the answer from the request (a Go stand-in for the service).
type GRPCCallHandler func(req *host.GRPCCallRequest) GRPCCallAnswer

// GRPCCallAnswer is how a gRPC call ends.
type GRPCCallAnswer struct {
	// Response is delivered after Delay of virtual time (0: right after the current
	// callback). Nil with Fail unset means the call is never answered, so it ends only by
	// timing out or being cancelled.
	Response *host.GRPCCallResponse
	Delay    time.Duration
	// Fail ends the call without an answer after Delay (the guest sees UNAVAILABLE, as
	// for a connect failure).
	Fail bool
	// UnknownCluster rejects the call at dispatch (the guest sees BadArgument).
	UnknownCluster bool
}

// GRPCRespond is a successful answer with message (serialized, unframed).
func GRPCRespond(message []byte) GRPCCallAnswer {
	return GRPCCallAnswer{Response: &host.GRPCCallResponse{Message: message}}
}

// GRPCError is an answer with a non-zero gRPC status and message.
func GRPCError(code uint32, message string) GRPCCallAnswer {
	return GRPCCallAnswer{Response: &host.GRPCCallResponse{Status: code, StatusMessage: message}}
}

// GRPCByCluster answers with a fixed answer per cluster; other clusters are unknown.
func GRPCByCluster(answers map[string]GRPCCallAnswer) GRPCCallHandler {
	return func(req *host.GRPCCallRequest) GRPCCallAnswer {
		a, ok := answers[req.Cluster]
		if !ok {
			return GRPCCallAnswer{UnknownCluster: true}
		}
		return a
	}
}

// GRPCCallRecord is one gRPC call the guest made and how it ended.
type GRPCCallRecord = CallRecord[host.GRPCCallRequest, host.GRPCCallResponse]

// GRPCCalls returns every gRPC call so far.
func (h *Harness) GRPCCalls() []GRPCCallRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return settled(h.grpcCalls)
}

func (h *Harness) dispatchGRPC(ctx context.Context, req *host.GRPCCallRequest, done func(*host.GRPCCallResponse, error)) error {
	rec := &GRPCCallRecord{Request: *req, Pending: true, ctx: ctx}
	ans := GRPCCallAnswer{UnknownCluster: true}
	if h.opts.GRPCCalls != nil {
		ans = h.opts.GRPCCalls(req)
	}
	if ans.UnknownCluster {
		return host.ErrUnknownCluster
	}
	h.mu.Lock()
	h.grpcCalls = append(h.grpcCalls, rec)
	h.mu.Unlock()
	h.schedule(ans.Response != nil || ans.Fail, ans.Delay, func() {
		resp, err := ans.Response, error(nil)
		if ans.Fail {
			resp, err = nil, errors.New("harness: grpc call failed")
		}
		rec.end(h, resp, err)
		done(resp, err)
	})
	return nil
}
