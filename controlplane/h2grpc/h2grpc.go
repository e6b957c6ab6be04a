// Package h2grpc is a gRPC client for one bidirectional stream over its own HTTP/2
// connection, read and written by the caller's goroutine: no transport goroutines and no
// hand-offs between them per message, the way Envoy's event loop drives its xDS stream.
// grpc-go's client spends four goroutine wake-ups on a response and its ACK; a load
// generator holding thousands of streams on the machine it measures spends most of its CPU
// there, competing with the server it measures.
//
// It speaks the gRPC wire protocol (gRPC over HTTP/2, PROTOCOL-HTTP2.md in grpc/grpc):
// length-prefixed messages in DATA frames, the status in trailers, HTTP/2 flow control in
// both directions. It does not compress, retry, resolve names or run TLS.
package h2grpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	streamID = 1 // the connection carries one stream
	// recvWindow is the window offered to the server, per stream and per connection: large
	// and fixed, as Envoy's (256 MiB by default), so responses never wait for an update.
	recvWindow = 16 << 20
	// keepSize is the largest message buffer a stream keeps between messages; bigger ones
	// (a CDS response) go back to the shared pool so thousands of idle streams do not each
	// hold one.
	keepSize = 64 << 10
	// maxMessage bounds a response, as grpc-go's MaxCallRecvMsgSize does.
	maxMessage = 64 << 20
)

// Stream is one gRPC bidirectional stream. Recv must be called from one goroutine at a
// time; Send may be called from any goroutine and never waits for the server's flow
// control window (data it does not allow yet is queued and sent as Recv reads window
// updates).
type Stream struct {
	conn net.Conn
	fr   *http2.Framer
	stop func() bool // unregisters the context's close

	// Receiving (Recv's goroutine only).
	pend    []byte // bytes of messages received but not returned yet
	unacked uint32 // DATA bytes consumed since the last window update
	ended   bool   // the server ended the stream
	headers bool   // response headers seen
	grpcErr error  // status from the trailers (nil for OK)

	// Sending and every write (Send and Recv's control replies).
	wmu      sync.Mutex
	bw       *bufio.Writer
	sendWin  int64  // the stream's send window
	connWin  int64  // the connection's send window
	initWin  int64  // the server's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame int    // the server's SETTINGS_MAX_FRAME_SIZE
	queued   []byte // framed messages; queued[:sent] are written
	sent     int
	werr     error
}

// Dial connects to addr (host:port, plaintext HTTP/2 with prior knowledge) and opens a
// stream calling method ("/package.Service/Method"). Cancelling ctx closes the connection.
func Dial(ctx context.Context, addr, method string) (*Stream, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Stream{conn: conn, bw: bufio.NewWriterSize(conn, 4<<10),
		sendWin: 65535, connWin: 65535, initWin: 65535, maxFrame: 16384}
	s.fr = http2.NewFramer(s.bw, bufio.NewReaderSize(conn, 64<<10))
	s.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	s.fr.MaxHeaderListSize = 1 << 20
	s.fr.SetReuseFrames()
	s.stop = context.AfterFunc(ctx, func() { conn.Close() })

	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method},
		{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	s.wmu.Lock()
	_, err = s.bw.WriteString(http2.ClientPreface)
	if err == nil {
		err = s.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: recvWindow})
	}
	if err == nil {
		err = s.fr.WriteWindowUpdate(0, recvWindow-65535)
	}
	if err == nil {
		err = s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: streamID, BlockFragment: hb.Bytes(), EndHeaders: true})
	}
	if err == nil {
		err = s.bw.Flush()
	}
	s.wmu.Unlock()
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("opening %s on %s: %w", method, addr, err)
	}
	return s, nil
}

// Close closes the connection; a blocked Recv returns.
func (s *Stream) Close() error {
	s.stop()
	return s.conn.Close()
}

// Send writes one message (its encoded bytes; b may be reused once Send returns).
func (s *Stream) Send(b []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.werr != nil {
		return s.werr
	}
	var prefix [5]byte // uncompressed, then the length
	binary.BigEndian.PutUint32(prefix[1:], uint32(len(b)))
	s.queued = append(append(s.queued, prefix[:]...), b...)
	return s.flushQueuedLocked()
}

// flushQueuedLocked writes as much queued data as the windows allow.
func (s *Stream) flushQueuedLocked() error {
	wrote := false
	for s.sent < len(s.queued) && s.werr == nil {
		n := min(int64(len(s.queued)-s.sent), s.sendWin, s.connWin, int64(s.maxFrame))
		if n <= 0 {
			break
		}
		s.werr = s.fr.WriteData(streamID, false, s.queued[s.sent:s.sent+int(n)])
		s.sendWin -= n
		s.connWin -= n
		s.sent += int(n)
		wrote = true
	}
	if s.sent == len(s.queued) {
		s.queued, s.sent = s.queued[:0], 0
		if cap(s.queued) > keepSize {
			s.queued = nil // a large request's storage is not kept
		}
	}
	if wrote && s.werr == nil {
		s.werr = s.bw.Flush()
	}
	return s.werr
}

// write runs one control write and flushes it.
func (s *Stream) write(f func() error) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.werr == nil {
		if s.werr = f(); s.werr == nil {
			s.werr = s.bw.Flush()
		}
	}
	return s.werr
}

// Recv returns the next message. The bytes are valid until the next call. At the end of
// the stream it returns io.EOF for an OK status and a gRPC status error otherwise.
func (s *Stream) Recv() ([]byte, error) {
	// An empty pend holds at most the message the last call returned, no longer in use:
	// a large buffer goes back to the pool.
	if len(s.pend) == 0 && cap(s.pend) > keepSize {
		putBuffer(s.pend)
		s.pend = nil
	}
	for {
		if msg, ok, err := s.next(); err != nil || ok {
			return msg, err
		}
		if s.ended {
			if len(s.pend) > 0 {
				return nil, status.Errorf(codes.Internal, "stream ended inside a message (%d bytes left)", len(s.pend))
			}
			if s.grpcErr != nil {
				return nil, s.grpcErr
			}
			return nil, io.EOF
		}
		f, err := s.fr.ReadFrame()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "reading from the server: %v", err)
		}
		if err := s.handle(f); err != nil {
			return nil, err
		}
	}
}

// next takes a complete message off pend.
func (s *Stream) next() ([]byte, bool, error) {
	if len(s.pend) < 5 {
		return nil, false, nil
	}
	if s.pend[0] != 0 {
		return nil, false, status.Error(codes.Unimplemented, "compressed message received (this client does not negotiate compression)")
	}
	n := binary.BigEndian.Uint32(s.pend[1:5])
	if n > maxMessage {
		return nil, false, status.Errorf(codes.ResourceExhausted, "received message of %d bytes, larger than the %d allowed", n, maxMessage)
	}
	if uint32(len(s.pend)-5) < n {
		return nil, false, nil
	}
	msg := s.pend[5 : 5+n]
	rest := s.pend[5+n:]
	if len(rest) == 0 {
		s.pend = s.pend[:0]
	} else {
		// The caller holds msg until the next call: keep the rest in new storage.
		s.pend = append([]byte(nil), rest...)
	}
	return msg, true, nil
}

func (s *Stream) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		if err := s.consumed(f.Length); err != nil {
			return err
		}
		if f.StreamID != streamID {
			return nil
		}
		if !s.headers {
			return status.Error(codes.Internal, "DATA before the response headers")
		}
		s.reserve(f.Data())
		s.pend = append(s.pend, f.Data()...)
		s.ended = s.ended || f.StreamEnded()
	case *http2.MetaHeadersFrame:
		if f.StreamID != streamID {
			return nil
		}
		return s.onHeaders(f)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		s.wmu.Lock()
		defer s.wmu.Unlock()
		if err := f.ForeachSetting(s.setting); err != nil {
			return err
		}
		if s.werr == nil {
			s.werr = s.fr.WriteSettingsAck()
		}
		if s.werr == nil {
			s.werr = s.bw.Flush()
		}
		if s.werr != nil {
			return s.werr
		}
		return s.flushQueuedLocked() // a larger window may let queued data go
	case *http2.WindowUpdateFrame:
		s.wmu.Lock()
		defer s.wmu.Unlock()
		switch f.StreamID {
		case 0:
			s.connWin += int64(f.Increment)
		case streamID:
			s.sendWin += int64(f.Increment)
		default:
			return nil
		}
		return s.flushQueuedLocked()
	case *http2.PingFrame:
		if !f.IsAck() {
			return s.write(func() error { return s.fr.WritePing(true, f.Data) })
		}
	case *http2.RSTStreamFrame:
		if f.StreamID == streamID {
			return status.Errorf(codes.Unavailable, "stream reset by the server: %v", f.ErrCode)
		}
	case *http2.GoAwayFrame:
		// A graceful GOAWAY lets open streams finish; ours is cut only if it is not among
		// the streams the server will still serve.
		if f.LastStreamID < streamID {
			return status.Errorf(codes.Unavailable, "connection closed by the server (GOAWAY %v: %s)", f.ErrCode, f.DebugData())
		}
	}
	return nil
}

// reserve makes room in pend for the whole message being assembled once its length is known
// (the first 5 bytes, in pend or in data): growing by append as frames arrive would copy a
// large message several times over.
func (s *Stream) reserve(data []byte) {
	var hdr [5]byte
	if n := copy(hdr[:], s.pend); n < 5 && copy(hdr[n:], data) < 5-n {
		return
	}
	need := 5 + int(binary.BigEndian.Uint32(hdr[1:]))
	if need > 5+maxMessage || cap(s.pend) >= need || need <= keepSize {
		return
	}
	grown := getBuffer(need)[:len(s.pend)]
	copy(grown, s.pend)
	if cap(s.pend) > keepSize {
		putBuffer(s.pend)
	}
	s.pend = grown
}

// Large message buffers are shared by all streams of the process, by power-of-two size
// class: thousands of clients taking the same large response one after another reuse a few
// buffers instead of allocating (and clearing) one each.
var buffers [32]sync.Pool

func sizeClass(n int) int { return bits.Len(uint(n - 1)) }

func getBuffer(n int) []byte {
	c := sizeClass(n)
	if b, ok := buffers[c].Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, 1<<c)
}

func putBuffer(b []byte) {
	c := sizeClass(cap(b))
	if cap(b) != 1<<c {
		return // not one of ours
	}
	b = b[:0]
	buffers[c].Put(&b)
}

// setting applies one of the server's settings (caller holds wmu).
func (s *Stream) setting(st http2.Setting) error {
	switch st.ID {
	case http2.SettingInitialWindowSize:
		s.sendWin += int64(st.Val) - s.initWin
		s.initWin = int64(st.Val)
	case http2.SettingMaxFrameSize:
		s.maxFrame = int(st.Val)
	}
	return nil
}

// consumed counts flow-controlled bytes the server sent and gives the window back once a
// quarter of it is used.
func (s *Stream) consumed(n uint32) error {
	s.unacked += n
	if s.unacked < recvWindow/4 {
		return nil
	}
	inc := s.unacked
	s.unacked = 0
	return s.write(func() error {
		if err := s.fr.WriteWindowUpdate(0, inc); err != nil {
			return err
		}
		return s.fr.WriteWindowUpdate(streamID, inc)
	})
}

// onHeaders checks the response headers and reads the status from the trailers (or from
// a trailers-only response).
func (s *Stream) onHeaders(f *http2.MetaHeadersFrame) error {
	if !s.headers {
		s.headers = true
		if st := f.PseudoValue("status"); st != "200" {
			code := codes.Unknown
			if st == "" {
				code = codes.Internal
			}
			return status.Errorf(code, "unexpected HTTP status %q from the server", st)
		}
		if ct := headerValue(f, "content-type"); !strings.HasPrefix(ct, "application/grpc") {
			return status.Errorf(codes.Internal, "unexpected content-type %q from the server", ct)
		}
	}
	if !f.StreamEnded() {
		return nil
	}
	s.ended = true
	raw := headerValue(f, "grpc-status")
	code, err := strconv.ParseUint(raw, 10, 32)
	if err != nil {
		return status.Errorf(codes.Internal, "the server ended the stream with grpc-status %q", raw)
	}
	if code != 0 {
		msg := headerValue(f, "grpc-message")
		if m, err := decodeGRPCMessage(msg); err == nil {
			msg = m
		}
		s.grpcErr = status.Error(codes.Code(code), msg)
	}
	return nil
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// decodeGRPCMessage undoes grpc-message's percent-encoding.
func decodeGRPCMessage(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", errors.New("truncated percent-encoding")
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}
