package server_test

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/require"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// fuzzTypes are the type URLs a fuzz input picks from (by index; past the end it sends its
// own string): every type the server serves, and some it does not.
var fuzzTypes = []string{cdsType, edsType, ldsType, rdsType, resourcev3.SecretType, resourcev3.ExtensionConfigType,
	resourcev3.RuntimeType, "type.googleapis.com/envoy.config.unknown.v3.Thing", ""}

// fuzzInput is one input decoded: the requests it sends on one stream.
type fuzzInput struct {
	delta   bool
	typ     string
	names   []string
	version string
	nonce   string
	node    *core.Node
	nack    bool
	repeat  int // requests sent on the stream (version and nonce games: the same, ACKs of nothing)
}

func decodeFuzzInput(t *testing.T, flags uint8, typeIdx uint8, typ, names string, fan uint16, version, nonce string, meta []byte) fuzzInput {
	in := fuzzInput{delta: flags&1 != 0, nack: flags&2 != 0, repeat: 1 + int(flags>>2&3), version: version, nonce: nonce}
	in.typ = typ
	if int(typeIdx) < len(fuzzTypes) {
		in.typ = fuzzTypes[typeIdx]
	}
	if names != "" {
		in.names = strings.Split(names, ",")
	}
	// Many names: fan more (the names again, suffixed), up to 20000 names and 5 MiB in all
	// (past gRPC's 4 MiB message limit, which the server must survive too).
	size := len(names)
	for i := 0; len(in.names) > 0 && i < int(fan) && len(in.names) < 20000 && size < 5<<20; i++ {
		n := in.names[i%len(in.names)] + "-" + strings.Repeat("x", i%64)
		in.names, size = append(in.names, n), size+len(n)
	}
	in.node = node(t, 3)
	var md map[string]any
	if json.Unmarshal(meta, &md) == nil {
		if s, err := structpb.NewStruct(md); err == nil {
			for k, v := range s.Fields { // of every shape: over the good ones, or beside them
				in.node.Metadata.Fields[k] = v
			}
		}
	} else if len(meta) > 0 {
		in.node.Metadata.Fields[string(meta)] = structpb.NewStringValue(string(meta))
	}
	switch flags >> 4 & 3 {
	case 1:
		in.node.Id = string(meta) // not Istio's form (or empty)
	case 2:
		in.node = nil
	}
	return in
}

// sendFuzz sends the input's requests on a new stream and reads what comes back until the
// stream ends or a short deadline passes; what the server answers is not judged, only
// that it answers in time or ends the stream.
func (m *testMesh) sendFuzz(t *testing.T, in fuzzInput) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var detail *statuspb.Status
	if in.nack {
		detail = nack("fuzz: " + in.version)
	}
	var send func(first bool) error
	var recv func() error
	if in.delta {
		st, err := m.ads.DeltaAggregatedResources(ctx)
		require.NoError(t, err)
		send = func(first bool) error {
			r := &discoverypb.DeltaDiscoveryRequest{TypeUrl: in.typ, ResponseNonce: in.nonce, ResourceNamesSubscribe: in.names,
				ResourceNamesUnsubscribe: in.names[len(in.names)/2:], ErrorDetail: detail,
				InitialResourceVersions: map[string]string{in.version: in.nonce}}
			if first {
				r.Node = in.node
			}
			return st.Send(r)
		}
		recv = func() error { _, err := st.Recv(); return err }
	} else {
		st, err := m.ads.StreamAggregatedResources(ctx)
		require.NoError(t, err)
		send = func(first bool) error {
			r := &discoverypb.DiscoveryRequest{TypeUrl: in.typ, ResponseNonce: in.nonce, ResourceNames: in.names,
				VersionInfo: in.version, ErrorDetail: detail}
			if first {
				r.Node = in.node
			}
			return st.Send(r)
		}
		recv = func() error { _, err := st.Recv(); return err }
	}
	done, answered := make(chan struct{}), make(chan struct{}, 1)
	go func() {
		defer close(done)
		for recv() == nil {
			select {
			case answered <- struct{}{}:
			default:
			}
		}
	}()
	for i := 0; i < in.repeat; i++ {
		if send(i == 0) != nil {
			break // the server ended the stream
		}
	}
	select { // an answer, the end, or (a type not served, say) nothing in time
	case <-done:
	case <-answered:
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	<-done
}

// FuzzADSRequest sends requests built from fuzz bytes (type URLs known and unknown, many and
// huge resource names, version and nonce games, NACKs, node metadata of every shape, nodes
// missing or misnamed) on a new stream of a live server, started once for the target: the
// server never panics nor hangs, after each input a proxy connecting as Envoy does still gets
// all it asks for, and every stream the input opened is gone.
func FuzzADSRequest(f *testing.F) {
	m := newMesh(f)
	f.Add(uint8(0), uint8(0), "", "", uint16(0), "", "", []byte(`{"CLUSTER_ID":"Kubernetes"}`))
	f.Add(uint8(1), uint8(1), "", frontendCluster+","+backendCluster, uint16(63), "v1", "nonce", []byte(`{"LABELS":{"app":"x"}}`))
	f.Add(uint8(2), uint8(2), "", "", uint16(0), "old", "stale", []byte(`{"INTERCEPTION_MODE":7,"NAMESPACE":null}`))
	f.Add(uint8(0x0f), uint8(7), "", "thing-1", uint16(5), "", "", []byte(`[1,2]`))
	f.Add(uint8(0x10), uint8(200), "type.googleapis.com/google.protobuf.Empty", "a", uint16(0), "", "", []byte("not~istio"))
	f.Add(uint8(0x21), uint8(3), "", "80,9080", uint16(1), "", "", []byte(`{"ISTIO_VERSION":{"nested":[true,{"x":1.5}]}}`))
	f.Add(uint8(0), uint8(1), "", strings.Repeat("n", 100000), uint16(19999), "", "", []byte(`{}`)) // a huge name, and 20000
	f.Fuzz(func(t *testing.T, flags, typeIdx uint8, typ, names string, fan uint16, version, nonce string, meta []byte) {
		// A hang is a failure: the whole input (its stream, the health check, the cleanup)
		// must be over well before the fuzzer's own deadline, or the stacks say where it hangs.
		watchdog := time.AfterFunc(8*time.Second, func() {
			buf := make([]byte, 1<<20)
			panic("fuzz input still running after 8s:\n" + string(buf[:runtime.Stack(buf, true)]))
		})
		defer watchdog.Stop()
		mt := m.in(t)
		in := decodeFuzzInput(t, flags, typeIdx, typ, names, fan, version, nonce, meta)
		mt.sendFuzz(t, in)
		p, got := mt.connect(4, in.delta)
		require.Equal(t, meshClusters, got[cdsType].names, "the server no longer serves a well-formed proxy")
		p.close()
		require.Eventually(t, func() bool { return len(m.srv.Connections()) == 0 }, 5*time.Second, time.Millisecond,
			"connections left behind: %v", m.srv.Connections())
	})
}
