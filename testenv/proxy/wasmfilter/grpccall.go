package wasmfilter

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// gRPC status codes meshproxy produces itself (the codes Envoy's async client reports).
const (
	grpcUnknown          = 2
	grpcDeadlineExceeded = 4
	grpcInternal         = 13
	grpcUnavailable      = 14
)

// maxGRPCResponse bounds the response body a call reads (gRPC's default receive limit).
const maxGRPCResponse = 4 << 20

// dispatchGRPC carries proxy_grpc_call to the named cluster as Envoy's gRPC async client
// does: a POST of one length-prefixed message over HTTP/2 (content-type application/grpc,
// te: trailers, grpc-timeout from the call's timeout), the status read from grpc-status
// and grpc-message in the trailers (or the headers of a trailers-only answer). A cluster
// with no healthy host, a connect failure or a reset is UNAVAILABLE (a reset past the
// call's deadline DEADLINE_EXCEEDED); a cluster that does
// not speak HTTP/2 cannot carry gRPC (Envoy requires http2_protocol_options) and fails the
// same way. The call's context, cancelled on timeout or cancel, resets the stream.
func (m *Manager) dispatchGRPC(ctx context.Context, req *host.GRPCCallRequest, done func(*host.GRPCCallResponse, error)) error {
	cl := m.opts.Clusters.Get(req.Cluster)
	if cl == nil {
		return host.ErrUnknownCluster
	}
	hr, err := grpcHTTPRequest(ctx, req)
	if err != nil {
		return err
	}
	// A stream broken past the call's deadline is DEADLINE_EXCEEDED, as gRPC clients
	// report it: the server, told the deadline by grpc-timeout, may reset the stream when
	// it passes, a moment before the host's own timer ends the call.
	deadline := time.Now().Add(req.Timeout)
	broken := func(msg string) *host.GRPCCallResponse {
		if req.Timeout > 0 && !time.Now().Before(deadline) {
			return &host.GRPCCallResponse{Status: grpcDeadlineExceeded, StatusMessage: "deadline exceeded: " + msg}
		}
		return unavailable(msg)
	}
	go func() {
		if !cl.UsesHTTP2(true) {
			done(unavailable(fmt.Sprintf("cluster %s is not configured for HTTP/2 (gRPC needs http2_protocol_options)", cl.Name)), nil)
			return
		}
		h := cl.Choose(&upstream.LBContext{Request: hr})
		if h == nil {
			done(unavailable("no healthy upstream"), nil)
			return
		}
		resp, err := cl.RoundTrip(hr, h, true)
		if err != nil {
			done(broken(err.Error()), nil)
			return
		}
		done(grpcResponse(resp, broken), nil)
	}()
	return nil
}

// grpcTimeout writes a timeout as gRPC's grpc-timeout header: at most 8 digits, in
// milliseconds, or in seconds, minutes or hours when it takes more (as Envoy rounds it).
func grpcTimeout(d time.Duration) string {
	v := d.Milliseconds()
	for _, u := range []struct {
		unit string
		next int64
	}{{"m", 1000}, {"S", 60}, {"M", 60}} {
		if v <= 99999999 {
			return strconv.FormatInt(v, 10) + u.unit
		}
		v /= u.next
	}
	return strconv.FormatInt(min(v, 99999999), 10) + "H"
}

func unavailable(msg string) *host.GRPCCallResponse {
	return &host.GRPCCallResponse{Status: grpcUnavailable, StatusMessage: msg}
}

// defaultAuthority is the :authority of a call whose GrpcService names none: Envoy sends
// the cluster name, which Go's HTTP/2 client refuses when it holds '|' (an Istio cluster
// name, outbound|PORT|SUBSET|HOST), so such a name gives its service, HOST:PORT, instead.
func defaultAuthority(cluster string) string {
	parts := strings.Split(cluster, "|")
	if len(parts) == 4 && parts[3] != "" && parts[1] != "" {
		return net.JoinHostPort(parts[3], parts[1])
	}
	return cluster
}

// grpcHTTPRequest frames the call as an HTTP/2 request.
func grpcHTTPRequest(ctx context.Context, req *host.GRPCCallRequest) (*http.Request, error) {
	authority := req.Authority
	if authority == "" {
		authority = defaultAuthority(req.Cluster)
	}
	body := make([]byte, 5, 5+len(req.Message))
	binary.BigEndian.PutUint32(body[1:], uint32(len(req.Message)))
	body = append(body, req.Message...)
	u := &url.URL{Scheme: "http", Host: "grpc.invalid", Path: "/" + req.Service + "/" + req.Method}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("grpc call %s/%s: %w", req.Service, req.Method, err)
	}
	hr.Host = authority
	for _, kv := range req.Metadata {
		if !strings.HasPrefix(kv[0], ":") {
			hr.Header.Add(kv[0], kv[1])
		}
	}
	hr.Header.Set("content-type", "application/grpc")
	hr.Header.Set("te", "trailers")
	if req.Timeout > 0 {
		hr.Header.Set("grpc-timeout", grpcTimeout(req.Timeout))
	}
	return hr, nil
}

// grpcResponse reads the answer: one message, then the status from the trailers, or from
// the headers of a trailers-only answer; a non-200 answer without grpc-status gets the
// status gRPC maps its HTTP status to.
func grpcResponse(resp *http.Response, broken func(string) *host.GRPCCallResponse) *host.GRPCCallResponse {
	defer resp.Body.Close()
	out := &host.GRPCCallResponse{InitialMetadata: metadataOf(resp.Header)}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxGRPCResponse+6))
	if err != nil {
		return broken(err.Error())
	}
	status, hasStatus := resp.Trailer.Get("grpc-status"), resp.Trailer.Get("grpc-status") != ""
	msg := resp.Trailer.Get("grpc-message")
	if !hasStatus && resp.Header.Get("grpc-status") != "" {
		// Trailers-only: the status is in the headers, which are then the trailers.
		status, hasStatus, msg = resp.Header.Get("grpc-status"), true, resp.Header.Get("grpc-message")
		out.TrailingMetadata, out.InitialMetadata = out.InitialMetadata, nil
	} else {
		out.TrailingMetadata = metadataOf(resp.Trailer)
	}
	switch {
	case resp.StatusCode != http.StatusOK && !hasStatus:
		out.Status, out.StatusMessage = httpToGRPCStatus(resp.StatusCode), fmt.Sprintf("upstream answered HTTP %d", resp.StatusCode)
		return out
	case !hasStatus:
		out.Status, out.StatusMessage = grpcUnknown, "no grpc-status in the answer"
		return out
	}
	code, err := strconv.ParseUint(status, 10, 32)
	if err != nil {
		out.Status, out.StatusMessage = grpcUnknown, "bad grpc-status "+strconv.Quote(status)
		return out
	}
	out.Status = uint32(code)
	if m, err := url.PathUnescape(msg); err == nil {
		msg = m
	}
	out.StatusMessage = msg
	if out.Status != 0 {
		return out
	}
	out.Message, out.StatusMessage = unframe(body)
	if out.StatusMessage != "" {
		out.Status = grpcInternal
	}
	return out
}

// unframe returns the one message of a unary answer, or why it has none.
func unframe(body []byte) ([]byte, string) {
	if len(body) < 5 {
		return nil, "no message in a successful unary answer"
	}
	if body[0] != 0 {
		return nil, "compressed message without a negotiated encoding"
	}
	n := binary.BigEndian.Uint32(body[1:5])
	if n > maxGRPCResponse {
		return nil, fmt.Sprintf("message of %d bytes exceeds the %d byte limit", n, maxGRPCResponse)
	}
	if uint64(len(body)-5) != uint64(n) {
		return nil, fmt.Sprintf("message framing: prefix says %d bytes, body has %d", n, len(body)-5)
	}
	return body[5:], ""
}

// httpToGRPCStatus is gRPC's mapping of an HTTP status without grpc-status, which Envoy
// applies too (Grpc::Utility::httpToGrpcStatus).
func httpToGRPCStatus(code int) uint32 {
	switch code {
	case http.StatusBadRequest:
		return grpcInternal
	case http.StatusUnauthorized:
		return 16
	case http.StatusForbidden:
		return 7
	case http.StatusNotFound:
		return 12
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return grpcUnavailable
	}
	return grpcUnknown
}

// metadataOf lists a header map as lower-case pairs, sorted by name.
func metadataOf(h http.Header) [][2]string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out [][2]string
	for _, k := range keys {
		for _, v := range h[k] {
			out = append(out, [2]string{strings.ToLower(k), v})
		}
	}
	return out
}
