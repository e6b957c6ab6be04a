package harness

import (
	"context"
	"testing"
	"time"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// BenchmarkDo is one request through the kitchen guest per iteration: headers only, a
// body the guest buffers until its end (three chunks, trailers on the response), and
// headers paused on an HTTP call answered 10 ms later in virtual time.
func BenchmarkDo(b *testing.B) {
	calls := ByCluster(map[string]HTTPCallAnswer{"auth": {Response: &host.HTTPCallResponse{
		Headers: [][2]string{{":status", "200"}}, Body: []byte("ok")}, Delay: 10 * time.Millisecond}})
	h := newHarness(b, Options{HTTPCalls: calls})
	chunk := make([]byte, 4096)
	for _, bc := range []struct {
		name string
		req  Request
	}{
		{"headers", Request{Path: "/"}},
		{"body", Request{Method: "POST", Headers: [][2]string{{"x-op", "buffer-body,resp-buffer"}},
			Body:     [][]byte{chunk, chunk, chunk},
			Response: Response{Body: [][]byte{chunk, chunk}, Trailers: [][2]string{{"x-t", "1"}}}}},
		{"httpcall", Request{Headers: [][2]string{{"x-op", "httpcall"}}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				rep, err := h.Do(ctx, bc.req)
				if err != nil || rep.Status != 200 {
					b.Fatalf("status %d, err %v", rep.Status, err)
				}
			}
		})
	}
}
