package h2grpc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// rawCodec lets the test server see and send messages as bytes.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// server is a real grpc-go server answering any method. Each request is a command:
// "echo <text>", "big <bytes> <count>" (count responses of that size), "len" (the
// request's length back), "fail <code> <message>", "end" (the stream ends OK).
func server(t *testing.T, opts ...grpc.ServerOption) (addr string, methods chan string) {
	addr, methods, _ = serverStoppable(t, opts...)
	return addr, methods
}

func serverStoppable(t *testing.T, opts ...grpc.ServerOption) (addr string, methods chan string, g *grpc.Server) {
	methods = make(chan string, 10)
	handler := func(_ any, st grpc.ServerStream) error {
		m, _ := grpc.MethodFromServerStream(st)
		methods <- m
		for {
			var req []byte
			if err := st.RecvMsg(&req); err != nil {
				return err
			}
			cmd, arg, _ := strings.Cut(string(req), " ")
			switch {
			case cmd == "echo":
				out := []byte(arg)
				if err := st.SendMsg(&out); err != nil {
					return err
				}
			case cmd == "big":
				f := strings.Fields(arg)
				size, _ := strconv.Atoi(f[0])
				count, _ := strconv.Atoi(f[1])
				for i := 0; i < count; i++ {
					out := bytes.Repeat([]byte{byte('a' + i%26)}, size)
					if err := st.SendMsg(&out); err != nil {
						return err
					}
				}
			case cmd == "fail":
				code, msg, _ := strings.Cut(arg, " ")
				c, _ := strconv.Atoi(code)
				return status.Error(codes.Code(c), msg)
			case cmd == "end":
				return nil
			default:
				out := []byte(strconv.Itoa(len(req)))
				if err := st.SendMsg(&out); err != nil {
					return err
				}
			}
		}
	}
	g = grpc.NewServer(append(opts, grpc.ForceServerCodecV2(rawCodec{}), grpc.UnknownServiceHandler(handler))...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String(), methods, g
}

func dial(t *testing.T, addr string) *Stream {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	s, err := Dial(ctx, addr, "/test.Svc/Stream")
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestMessagesBothWays(t *testing.T) {
	addr, methods := server(t)
	s := dial(t, addr)
	for i := 0; i < 100; i++ {
		require.NoError(t, s.Send([]byte(fmt.Sprintf("echo message %d", i))))
		got, err := s.Recv()
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("message %d", i), string(got))
	}
	assert.Equal(t, "/test.Svc/Stream", <-methods, "the server sees the method dialled")

	// Several requests before reading: they are written in order and answered in order.
	for i := 0; i < 10; i++ {
		require.NoError(t, s.Send([]byte(fmt.Sprintf("echo %d", i))))
	}
	for i := 0; i < 10; i++ {
		got, err := s.Recv()
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(i), string(got))
	}
	require.NoError(t, s.Send([]byte("end")))
	_, err := s.Recv()
	assert.ErrorIs(t, err, io.EOF, "an OK end of the stream")
}

// More than the window the client offers (16 MiB) arrives in messages larger than a frame:
// the stream stalls unless the client gives the window back as it reads.
func TestLargeResponsesGiveTheWindowBack(t *testing.T) {
	addr, _ := server(t)
	s := dial(t, addr)
	const size, count = 3<<20 + 17, 8
	require.NoError(t, s.Send([]byte(fmt.Sprintf("big %d %d", size, count))))
	for i := 0; i < count; i++ {
		got, err := s.Recv()
		require.NoError(t, err)
		require.Len(t, got, size)
		require.Equal(t, size, bytes.Count(got, []byte{byte('a' + i)}), "message %d holds its own bytes only", i)
	}
	require.NoError(t, s.Send([]byte("echo after")))
	got, err := s.Recv()
	require.NoError(t, err)
	assert.Equal(t, "after", string(got))
}

// A request larger than the server's window (64 KiB here) waits for its window updates,
// which the client reads while it waits for the answer; Send itself does not block.
func TestLargeRequestWaitsForTheServersWindow(t *testing.T) {
	addr, _ := server(t, grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	s := dial(t, addr)
	for _, size := range []int{1 << 20, 200 << 10, 5} {
		req := append([]byte("len "), bytes.Repeat([]byte("x"), size-4)...)
		done := make(chan error, 1)
		go func() { done <- s.Send(req) }()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Send blocked on the server's flow control window")
		}
		got, err := s.Recv()
		require.NoError(t, err)
		assert.Equal(t, strconv.Itoa(size), string(got))
	}
}

func TestStatusFromTrailers(t *testing.T) {
	addr, _ := server(t)
	s := dial(t, addr)
	require.NoError(t, s.Send([]byte("echo first")))
	_, err := s.Recv()
	require.NoError(t, err)
	require.NoError(t, s.Send([]byte("fail 7 no entry: 100% denied")))
	_, err = s.Recv()
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Equal(t, "no entry: 100% denied", status.Convert(err).Message(), "grpc-message is percent-decoded")

	// A status before any message: a trailers-only response.
	s = dial(t, addr)
	require.NoError(t, s.Send([]byte("fail 3 bad request")))
	_, err = s.Recv()
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
}

func TestUnknownMethod(t *testing.T) {
	g := grpc.NewServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	s := dial(t, lis.Addr().String())
	require.NoError(t, s.Send([]byte("x")))
	_, err = s.Recv()
	assert.Equal(t, codes.Unimplemented, status.Code(err), "a server without the method says so: %v", err)
}

func TestServerGoneMidStream(t *testing.T) {
	addr, _, g := serverStoppable(t)
	s := dial(t, addr)
	require.NoError(t, s.Send([]byte("echo up")))
	_, err := s.Recv()
	require.NoError(t, err)
	g.Stop()
	_, err = s.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err), "a connection that closes mid-stream: %v", err)
}

func TestCancelClosesTheStream(t *testing.T) {
	addr, _ := server(t)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Dial(ctx, addr, "/test.Svc/Stream")
	require.NoError(t, err)
	errs := make(chan error, 1)
	go func() {
		_, err := s.Recv()
		errs <- err
	}()
	cancel()
	select {
	case err := <-errs:
		assert.Equal(t, codes.Unavailable, status.Code(err))
	case <-time.After(10 * time.Second):
		t.Fatal("Recv did not return after the context was cancelled")
	}
	assert.Error(t, s.Send([]byte("echo late")), "sending on a closed stream fails")
}
