package main

import (
	"encoding/binary"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// grpcConfig is the plugin configuration's "grpc" object: where the grpc-* ops call.
type grpcConfig struct {
	// Target is the cluster name.
	Target string `json:"target"`
	// GrpcService passes the target as a serialized GrpcService (envoy_grpc) rather
	// than a plain cluster name; Authority goes in envoy_grpc.authority.
	GrpcService bool   `json:"grpcService"`
	Authority   string `json:"authority"`
	Service     string `json:"service"`
	Method      string `json:"method"`
	TimeoutMs   uint32 `json:"timeoutMs"`
}

// pluginConfig is the sdkguest's plugin configuration (JSON; empty is fine).
type pluginConfig struct {
	GRPC grpcConfig `json:"grpc"`
}

var config pluginConfig

func loadConfig() bool {
	b, err := proxywasm.GetPluginConfiguration()
	if err != nil || len(b) == 0 {
		return true
	}
	if err := json.Unmarshal(b, &config); err != nil {
		proxywasm.LogCriticalf("sdkguest: bad configuration: %v", err)
		return false
	}
	return true
}

// grpcCall is an outstanding call: the stream that made it, what its callbacks saw, and
// the callback in which the guest cancels it (the op grpc-cancel-in-<callback>).
type grpcCall struct {
	stream   *httpContext
	trace    []string
	cancelIn string
}

var grpcCalls = map[uint32]*grpcCall{}

// appendVarint and appendField write the protobuf wire format of a length-delimited field.
func appendField(b []byte, field uint64, v []byte) []byte {
	b = binary.AppendUvarint(b, field<<3|2)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// grpcService is the call's service argument: a serialized GrpcService
// {envoy_grpc: {cluster_name, authority}} or the plain cluster name.
func grpcService(c grpcConfig) []byte {
	if !c.GrpcService {
		return []byte(c.Target)
	}
	inner := appendField(nil, 1, []byte(c.Target))
	if c.Authority != "" {
		inner = appendField(inner, 2, []byte(c.Authority))
	}
	return appendField(nil, 1, inner)
}

// encodePairs is the proxy-wasm map serialization.
func encodePairs(pairs [][2]string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(pairs)))
	for _, kv := range pairs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(kv[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(kv[1])))
	}
	for _, kv := range pairs {
		b = append(append(append(b, kv[0]...), 0), kv[1]...)
		b = append(b, 0)
	}
	return b
}

// decodePairs reads the proxy-wasm map serialization as "k=v;k=v".
func decodePairs(b []byte) string {
	if len(b) < 4 {
		return ""
	}
	n := int(binary.LittleEndian.Uint32(b))
	sizes := b[4:]
	data := b[4+8*n:]
	var out []string
	for i := range n {
		kl := int(binary.LittleEndian.Uint32(sizes[8*i:]))
		vl := int(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		out = append(out, string(data[:kl])+"="+string(data[kl+1:kl+1+vl]))
		data = data[kl+vl+2:]
	}
	return strings.Join(out, ";")
}

// grpcStart runs the grpc-* ops: it calls the configured service with the message in
// x-grpc-message and the metadata in x-grpc-md ("k=v,k=v"), and reports whether the
// stream waits for the answer. x-grpc-call reports the call's status; grpc-cancel
// cancels the call at once (x-grpc-cancel: cancel, a second cancel, a close).
func (h *httpContext) grpcStart() bool {
	msg, _ := proxywasm.GetHttpRequestHeader("x-grpc-message")
	mdText, _ := proxywasm.GetHttpRequestHeader("x-grpc-md")
	var md [][2]string
	for kv := range strings.SplitSeq(mdText, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			md = append(md, [2]string{k, v})
		}
	}
	c := config.GRPC
	if t, err := proxywasm.GetHttpRequestHeader("x-grpc-target"); err == nil {
		c.Target = t
	}
	token, st := rawGRPCCall(grpcService(c), c.Service, c.Method, encodePairs(md), []byte(msg), c.TimeoutMs)
	h.set("x-grpc-call", strconv.Itoa(int(st)))
	if st != 0 {
		return false
	}
	h.set("x-grpc-id", strconv.Itoa(int(token)))
	if h.op == "grpc-cancel" {
		h.set("x-grpc-cancel", strings.Join([]string{strconv.Itoa(int(rawGRPCCancel(token))),
			strconv.Itoa(int(rawGRPCCancel(token))), strconv.Itoa(int(rawGRPCClose(token)))}, ","))
		return false
	}
	grpcCalls[token] = &grpcCall{stream: h, cancelIn: strings.TrimPrefix(h.op, "grpc-cancel-in-")}
	return true
}

// grpcEvent records one callback of call token; the callback that ends the call for the
// guest (close, or the one the op cancels in) resumes the stream with the trace.
func grpcEvent(token uint32, name, what string) {
	c := grpcCalls[token]
	if c == nil {
		// A callback for a call the guest no longer has: the host broke its promise.
		proxywasm.LogCriticalf("sdkguest: %s for unknown grpc call %d", name, token)
		return
	}
	c.trace = append(c.trace, name+"("+what+")")
	end := name == "close" || name == "msg" // a unary call gets one of the two
	if c.cancelIn == name {
		c.trace = append(c.trace, "cancel="+strconv.Itoa(int(rawGRPCCancel(token))))
		end = true
	}
	if !end {
		return
	}
	delete(grpcCalls, token)
	h := c.stream
	if err := proxywasm.SetEffectiveContext(h.id); err != nil {
		proxywasm.LogCriticalf("sdkguest: stream %d is gone: %v", h.id, err)
		return
	}
	h.set("x-grpc-trace", strings.Join(c.trace, "|"))
	_ = proxywasm.ResumeHttpRequest()
}

func onGRPCInitialMetadata(token, n uint32) {
	md, st := rawGetMap(4)
	grpcEvent(token, "imd", strconv.Itoa(int(n))+":"+decodePairs(md)+":"+strconv.Itoa(int(st)))
}

// onGRPCReceive records the message, the status and the response's metadata (initial,
// then trailing), all read during the one callback a successful unary call gets.
func onGRPCReceive(token, size uint32) {
	b, st := rawGetBuffer(5, 0, size)
	code, msg := rawGetStatus()
	imd, _ := rawGetMap(4)
	tmd, _ := rawGetMap(5)
	grpcEvent(token, "msg", strconv.Itoa(int(size))+":"+string(b)+":"+strconv.Itoa(int(st))+":"+strconv.Itoa(int(code))+msg+
		":"+decodePairs(imd)+"#"+decodePairs(tmd))
}

func onGRPCTrailingMetadata(token, n uint32) {
	md, st := rawGetMap(5)
	grpcEvent(token, "tmd", strconv.Itoa(int(n))+":"+decodePairs(md)+":"+strconv.Itoa(int(st)))
}

func onGRPCClose(token, code uint32) {
	st, msg := rawGetStatus()
	// The buffer is the receive callback's alone.
	_, bst := rawGetBuffer(5, 0, 100)
	grpcEvent(token, "close", strconv.Itoa(int(code))+":"+strconv.Itoa(int(st))+":"+msg+":buf="+strconv.Itoa(int(bst)))
}
