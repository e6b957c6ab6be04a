package host

import (
	"context"
	"errors"
	"time"

	"github.com/wasmesh/wasmesh/wasm/protowire"
)

// gRPC status codes the host itself produces.
const (
	// GRPCStatusOK is a call that succeeded.
	GRPCStatusOK uint32 = 0
	// GRPCStatusDeadlineExceeded is a call the host timed out.
	GRPCStatusDeadlineExceeded uint32 = 4
	// GRPCStatusUnavailable is a call that failed before any answer: no healthy host,
	// connect failure, reset (what Envoy's async client reports for these).
	GRPCStatusUnavailable uint32 = 14
)

var (
	// ErrGRPCCallTimeout is the cause of a timed-out gRPC call's dispatcher context.
	ErrGRPCCallTimeout = errors.New("wasm host: grpc call timed out")
	// ErrGRPCCallCancelled is the cause of the dispatcher context of a call the guest
	// cancelled or closed.
	ErrGRPCCallCancelled = errors.New("wasm host: grpc call cancelled by the guest")
)

// GRPCCallRequest is what a guest asked for through proxy_grpc_call.
type GRPCCallRequest struct {
	// Cluster is the target: envoy_grpc.cluster_name of the GrpcService the guest passed,
	// or the plain name it passed instead.
	Cluster string
	// Authority is envoy_grpc.authority (empty: the dispatcher uses the cluster name, as
	// Envoy does).
	Authority string
	// Service and Method name the RPC: the path is "/" + Service + "/" + Method.
	Service, Method string
	// Metadata is the guest's initial metadata, followed by the GrpcService's
	// initial_metadata.
	Metadata [][2]string
	// Message is the serialized request, without gRPC framing.
	Message []byte
	// Timeout is the guest's timeout; the host enforces it (0 means none).
	Timeout time.Duration
	// Plugin is the calling plugin's name.
	Plugin string
}

// GRPCCallResponse is how a gRPC call ended.
type GRPCCallResponse struct {
	InitialMetadata [][2]string
	// Message is the response message without framing; only delivered when Status is 0.
	Message          []byte
	TrailingMetadata [][2]string
	// Status is the gRPC status code (grpc-status), Message the grpc-message.
	Status        uint32
	StatusMessage string
}

// GRPCCallDispatcher sends unary gRPC calls for guests.
type GRPCCallDispatcher interface {
	// DispatchGRPCCall starts req and returns at once. It must call done exactly once,
	// from any goroutine and at any time, even before it returns. done with a non-nil
	// error is a call that failed without an answer: the guest sees UNAVAILABLE (14) with
	// the error's text as the message. ctx is cancelled once the call has ended; its cause
	// is ErrGRPCCallTimeout when the host timed it out, ErrGRPCCallCancelled when the
	// guest cancelled it and ErrClosed when the plugin closed or the VM went away.
	// Returning ErrUnknownCluster makes the guest's call fail with BadArgument, any other
	// error with InternalFailure; done is then not called.
	DispatchGRPCCall(ctx context.Context, req *GRPCCallRequest, done func(*GRPCCallResponse, error)) error
}

// GRPCCallDispatcherFunc adapts a function to GRPCCallDispatcher.
type GRPCCallDispatcherFunc func(ctx context.Context, req *GRPCCallRequest, done func(*GRPCCallResponse, error)) error

// DispatchGRPCCall calls f.
func (f GRPCCallDispatcherFunc) DispatchGRPCCall(ctx context.Context, req *GRPCCallRequest, done func(*GRPCCallResponse, error)) error {
	return f(ctx, req, done)
}

// Guest callbacks of a gRPC call.
const (
	fnOnGRPCReceiveInitialMetadata  = "proxy_on_grpc_receive_initial_metadata"
	fnOnGRPCReceive                 = "proxy_on_grpc_receive"
	fnOnGRPCReceiveTrailingMetadata = "proxy_on_grpc_receive_trailing_metadata"
	fnOnGRPCClose                   = "proxy_on_grpc_close"
)

// grpcTarget is what the service argument of proxy_grpc_call names.
type grpcTarget struct {
	cluster, authority string
	metadata           [][2]string
	google             bool
}

// parseGRPCService reads the fields of a serialized envoy.config.core.v3.GrpcService the
// host uses: envoy_grpc (1) {cluster_name (1), authority (2)}, google_grpc (2) and
// initial_metadata (5) {key (1), value (2)}. ok is false when b is not a well-formed
// message, or names neither an envoy_grpc cluster nor google_grpc: the guest then passed
// a plain cluster name.
func parseGRPCService(b []byte) (t grpcTarget, ok bool) {
	err := walkProto(b, func(field uint64, v []byte) error {
		switch field {
		case 1:
			return walkProto(v, func(f uint64, s []byte) error {
				switch f {
				case 1:
					t.cluster = string(s)
				case 2:
					t.authority = string(s)
				}
				return nil
			})
		case 2:
			t.google = true
		case 5:
			var kv [2]string
			if err := walkProto(v, func(f uint64, s []byte) error {
				if f == 1 || f == 2 {
					kv[f-1] = string(s)
				}
				return nil
			}); err != nil {
				return err
			}
			t.metadata = append(t.metadata, kv)
		}
		return nil
	})
	return t, err == nil && (t.cluster != "" || t.google)
}

// walkProto calls fn with every length-delimited field of a protobuf message and checks
// that the other fields are well formed (the wire format only, as a parser that keeps
// unknown fields does).
func walkProto(b []byte, fn func(field uint64, v []byte) error) error {
	return protowire.Each(b, func(f protowire.Field) error {
		if f.Wire != protowire.Bytes {
			return nil
		}
		return fn(uint64(f.Num), f.Bytes)
	})
}

// grpcRequest reads proxy_grpc_call's arguments into a request.
func (vc *vmCall) grpcRequest(s []uint64) (*GRPCCallRequest, Status) {
	mem := vc.mem()
	service, ok1 := readBytes(mem, u32(s, 0), u32(s, 1))
	svcName, ok2 := readString(mem, u32(s, 2), u32(s, 3))
	method, ok3 := readString(mem, u32(s, 4), u32(s, 5))
	md, ok4 := readBytes(mem, u32(s, 6), u32(s, 7))
	msg, ok5 := readBytes(mem, u32(s, 8), u32(s, 9))
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !canWrite(mem, u32(s, 11), 4) {
		return nil, StatusInvalidMemoryAccess
	}
	metadata, err := DecodePairs(md)
	if err != nil {
		return nil, StatusBadArgument
	}
	t, parsed := parseGRPCService(service)
	if !parsed {
		t = grpcTarget{cluster: string(service)}
	}
	if t.google {
		vc.vm.p.log.Warn("grpc call: google_grpc services are not supported, only envoy_grpc or a cluster name")
		return nil, StatusBadArgument
	}
	if t.cluster == "" || svcName == "" || method == "" {
		return nil, StatusBadArgument
	}
	return &GRPCCallRequest{Cluster: t.cluster, Authority: t.authority, Service: svcName, Method: method,
		Metadata: append(metadata, t.metadata...), Message: msg,
		Timeout: time.Duration(u32(s, 10)) * time.Millisecond, Plugin: vc.vm.p.cfg.Name}, StatusOK
}

// nextGRPCToken returns a free call id. gRPC call ids are odd, as in Envoy (whose stream
// ids are even), and have their own space, apart from HTTP call tokens.
func (v *vm) nextGRPCToken() uint32 {
	for {
		v.grpcToken += 2
		if v.grpcToken%2 == 0 {
			v.grpcToken = 1
		}
		if _, used := v.grpcCalls[v.grpcToken]; !used {
			return v.grpcToken
		}
	}
}

func (vc *vmCall) proxyGRPCCall(ctx context.Context, s []uint64) Status {
	v := vc.vm
	p := v.p
	if p.env.GRPCCalls == nil {
		// The embedder has no gRPC support, whatever the arguments.
		return StatusUnimplemented
	}
	req, st := vc.grpcRequest(s)
	if st != StatusOK {
		return st
	}
	token := v.nextGRPCToken()
	pc, callCtx, finish := startCall(v, v.grpcCalls, token, req.Timeout, ErrGRPCCallTimeout, func(pc *pendingCall, resp *GRPCCallResponse, err error) {
		v.deliverGRPCCall(token, pc, grpcOutcome(resp, err))
	})
	if err := p.env.GRPCCalls.DispatchGRPCCall(callCtx, req, finish); err != nil {
		pc.abandon(err)
		delete(v.grpcCalls, token)
		if errors.Is(err, ErrUnknownCluster) {
			return StatusBadArgument
		}
		p.log.Warn("grpc call dispatch failed", "cluster", req.Cluster, "error", err)
		return StatusInternalFailure
	}
	writeU32(vc.mem(), u32(s, 11), token)
	return StatusOK
}

// grpcOutcome turns what the dispatcher (or the timer) reported into the response the
// guest sees.
func grpcOutcome(resp *GRPCCallResponse, err error) *GRPCCallResponse {
	switch {
	case errors.Is(err, ErrGRPCCallTimeout):
		return &GRPCCallResponse{Status: GRPCStatusDeadlineExceeded, StatusMessage: "timeout"}
	case err != nil:
		return &GRPCCallResponse{Status: GRPCStatusUnavailable, StatusMessage: err.Error()}
	case resp == nil:
		return &GRPCCallResponse{Status: GRPCStatusUnavailable, StatusMessage: "no response"}
	}
	return resp
}

// proxyGRPCCancel ends a pending call without any callback: the dispatcher's context is
// cancelled (cause ErrGRPCCallCancelled) and a late answer is dropped. proxy_grpc_close
// does the same for a unary call, as in Envoy.
func (vc *vmCall) proxyGRPCCancel(ctx context.Context, s []uint64) Status {
	v := vc.vm
	token := u32(s, 0)
	pc, ok := v.grpcCalls[token]
	if !ok {
		return StatusNotFound
	}
	delete(v.grpcCalls, token)
	pc.abandon(ErrGRPCCallCancelled)
	return StatusOK
}

// deliverGRPCCall runs the call's one callback in the root context, as Envoy does for a
// unary call (its async request's onSuccess and onFailure): proxy_on_grpc_receive with the
// message when the call succeeded, proxy_on_grpc_close with the code when it failed. The
// response's metadata maps are readable during either. The call is forgotten after its
// callback (a cancel inside it is still Ok and does nothing).
func (v *vm) deliverGRPCCall(token uint32, pc *pendingCall, resp *GRPCCallResponse) {
	if !v.alive() || v.grpcCalls[token] != pc {
		return
	}
	if pc.stop != nil {
		pc.stop()
	}
	fn, n := fnOnGRPCClose, int(resp.Status)
	if resp.Status == GRPCStatusOK {
		fn, n = fnOnGRPCReceive, len(resp.Message)
	}
	vc := &vmCall{vm: v, effective: v.rootID, callback: fn, grpcResp: resp, grpcReceive: fn == fnOnGRPCReceive}
	if _, _, err := v.call(vc, fn, uint64(v.rootID), uint64(token), uint64(n)); err != nil {
		v.in.fail(v, err, nil) // kills the VM, its calls with it
		return
	}
	if v.grpcCalls[token] == pc {
		delete(v.grpcCalls, token)
	}
}

// grpcStatus is proxy_get_status during a gRPC call's callbacks.
func (vc *vmCall) grpcStatus() (uint32, string) {
	return vc.grpcResp.Status, vc.grpcResp.StatusMessage
}
