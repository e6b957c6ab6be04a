//go:build !wasip1

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/harness"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// The upstream SDK against wasmesh's host: every kind of result the host hands back
// (values, maps, properties, shared data, queues, foreign calls, bodies), a large result,
// and results kept across callbacks while later calls allocate more.
func TestSDKAgainstTheHost(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 40<<10/16)
	sum := sha256.Sum256([]byte(big))
	h := wasmtest.Harness(t, ".", harness.Options{
		Properties: map[string]any{"node": map[string]any{"metadata": map[string]any{
			"LABELS": map[string]string{"app": "ratings", "version": "v1"}}}},
		ForeignFunctions: map[string]host.ForeignFunction{
			"echo": func(_ context.Context, args []byte) ([]byte, host.Status) {
				return append([]byte("echo:"), args...), host.StatusOK
			},
		},
	})
	for _, tc := range []struct {
		op      string
		headers [][2]string
		body    [][]byte
		want    map[string]string
	}{
		{op: "headers", headers: [][2]string{{"x-in", "hello"}}, want: map[string]string{
			"x-err": "ok", "x-in": "hello/ok", "x-missing": "not_found",
			"x-all": ":scheme=http,:method=GET,:path=/p,:authority=a,x-op=headers,x-in=hello"}},
		{op: "property", want: map[string]string{
			"x-path": "/p/ok", "x-labels": "app=ratings,version=v1/ok", "x-missing": "not_found"}},
		{op: "big", headers: [][2]string{{"x-big", big}}, want: map[string]string{
			"x-big": "40960/" + hex.EncodeToString(sum[:8]) + "/ok"}},
		{op: "shared", want: map[string]string{
			"x-shared": "ok,v1,ok,ok,cas_mismatch,v2,not_found,true,ok"}},
		{op: "queue", want: map[string]string{"x-queue": "ok,ok,ok,a/ok,bb/ok,/empty"}},
		{op: "foreign", want: map[string]string{"x-foreign": "echo:ping/ok"}},
		{op: "retain", headers: [][2]string{{"x-in", "kept-across-callbacks"}}, want: map[string]string{
			"x-retained": "kept-across-callbacks"}},
		{op: "body", body: [][]byte{[]byte("chunk1,"), []byte("chunk2")}, want: map[string]string{
			"x-body": "chunk1,chunk2/ok", "x-body-past-end": "not_found"}},
	} {
		t.Run(tc.op, func(t *testing.T) {
			hs := append([][2]string{{":method", "GET"}, {":path", "/p"}, {":authority", "a"}, {"x-op", tc.op}}, tc.headers...)
			rep, err := h.Do(context.Background(), harness.Request{Headers: hs, Body: tc.body,
				Response: harness.Response{Status: 200}})
			require.NoError(t, err)
			require.Empty(t, rep.Failures)
			for k, v := range tc.want {
				assert.Equal(t, v, rep.Client.Header(k), k)
			}
		})
	}
}
