package adsc

import (
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/wasmesh/wasmesh/controlplane/h2grpc"
)

// grpcTransport is a grpc-go stream. Its Send can block on flow control, so requests go
// out through a queue drained by their own goroutine.
type grpcTransport struct {
	st  grpc.ClientStream
	cur mem.Buffer // the last response, freed by the next Recv

	mu   sync.Mutex
	out  []proto.Message
	wake chan struct{}
}

func newGRPCTransport(st grpc.ClientStream) *grpcTransport {
	t := &grpcTransport{st: st, wake: make(chan struct{}, 1)}
	go t.sender()
	return t
}

func (t *grpcTransport) Recv() ([]byte, error) {
	if t.cur != nil {
		t.cur.Free()
		t.cur = nil
	}
	var f frame
	if err := t.st.RecvMsg(&f); err != nil {
		return nil, err
	}
	t.cur = f.buf
	return f.buf.ReadOnlyData(), nil
}

// Send queues m; it never blocks.
func (t *grpcTransport) Send(m proto.Message) error {
	t.mu.Lock()
	t.out = append(t.out, m)
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
	return nil
}

// sender writes queued requests in order until the stream ends; a send error ends it and
// the reader reports the broken stream.
func (t *grpcTransport) sender() {
	done := t.st.Context().Done()
	for {
		select {
		case <-t.wake:
		case <-done:
			return
		}
		t.mu.Lock()
		batch := t.out
		t.out = nil
		t.mu.Unlock()
		for _, m := range batch {
			if t.st.SendMsg(m) != nil {
				return
			}
		}
	}
}

// frame receives a response's bytes undecoded (see rawCodec).
type frame struct{ buf mem.Buffer }

// rawCodec hands responses to the client as bytes; requests go through proto.
type rawCodec struct{ proto encoding.CodecV2 }

func (rawCodec) Name() string { return "proto" }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		f.buf = data.MaterializeToBuffer(mem.DefaultBufferPool())
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// h2Transport is an h2grpc stream: requests are written by the caller, which h2grpc never
// blocks on flow control.
type h2Transport struct {
	st  *h2grpc.Stream
	buf []byte
}

func (t *h2Transport) Recv() ([]byte, error) { return t.st.Recv() }

func (t *h2Transport) Send(m proto.Message) error {
	var err error
	if t.buf, err = (proto.MarshalOptions{}).MarshalAppend(t.buf[:0], m); err != nil {
		return err
	}
	return t.st.Send(t.buf)
}
