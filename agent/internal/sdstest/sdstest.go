// Package sdstest is the proxy's side of SDS for the agent's tests: a gRPC client on the
// agent's Unix socket and the decoding of the secrets it receives.
package sdstest

import (
	"context"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Dial connects to the SDS socket at path until the test ends.
func Dial(t testing.TB, path string) secretv3.SecretDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return secretv3.NewSecretDiscoveryServiceClient(conn)
}

// Recv waits up to 10 s for the next message of a stream.
func Recv[T any](t testing.TB, f func() (T, error)) T {
	t.Helper()
	got := make(chan T, 1)
	errs := make(chan error, 1)
	go func() {
		v, err := f()
		if err != nil {
			errs <- err
			return
		}
		got <- v
	}()
	var zero T
	select {
	case v := <-got:
		return v
	case err := <-errs:
		t.Fatalf("stream: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no response within 10 s")
	}
	return zero
}

// Secrets decodes resources, each checked with Envoy's validation rules, by name.
func Secrets(t testing.TB, resources ...*anypb.Any) map[string]*tlsv3.Secret {
	t.Helper()
	out := map[string]*tlsv3.Secret{}
	for _, a := range resources {
		s := &tlsv3.Secret{}
		require.NoError(t, proto.Unmarshal(a.GetValue(), s))
		require.NoError(t, s.ValidateAll(), "a valid Envoy secret")
		out[s.GetName()] = s
	}
	return out
}

// Stream is a State of the World stream for one secret, as Envoy opens one per secret.
type Stream struct {
	t    testing.TB
	name string
	s    secretv3.SecretDiscoveryService_StreamSecretsClient
	last *discoveryv3.DiscoveryResponse
}

// Watch opens a stream asking for the secret name, once the socket accepts.
func Watch(ctx context.Context, t testing.TB, c secretv3.SecretDiscoveryServiceClient, name string) *Stream {
	t.Helper()
	// Waits for the socket, as Envoy retries its SDS stream.
	s, err := c.StreamSecrets(ctx, grpc.WaitForReady(true))
	require.NoError(t, err)
	require.NoError(t, s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{name}}))
	return &Stream{t: t, name: name, s: s}
}

// Next waits for the secret's next version.
func (s *Stream) Next() (*tlsv3.Secret, *discoveryv3.DiscoveryResponse) {
	s.t.Helper()
	resp := Recv(s.t, s.s.Recv)
	got := Secrets(s.t, resp.GetResources()...)
	require.Len(s.t, got, 1, "only the secret asked for, %s", s.name)
	s.last = resp
	return got[s.name], resp
}

// ACK accepts the last version received.
func (s *Stream) ACK() {
	s.t.Helper()
	require.NoError(s.t, s.s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{s.name},
		VersionInfo: s.last.GetVersionInfo(), ResponseNonce: s.last.GetNonce()}))
}

// NACK rejects the last version received, keeping the one before, as Envoy does.
func (s *Stream) NACK(kept *discoveryv3.DiscoveryResponse, message string) {
	s.t.Helper()
	require.NoError(s.t, s.s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{s.name},
		VersionInfo: kept.GetVersionInfo(), ResponseNonce: s.last.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: message}}))
}
