package wasmfilter

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// chunkSize is how much body one read of the goroutine reader takes.
const chunkSize = hcm.BodyBufferSize

var (
	errResponseReset = errors.New("response reset by a wasm filter")
	errTooLarge      = errors.New("wasm filter buffered more than the buffer limit")
)

// chunk is one piece of body with its end of stream.
type chunk struct {
	data []byte
	eof  bool
	err  error
}

// chunkSource yields a body in chunks: directly from the reader, or (once a paused filter
// must wait for the body and for its own signals at the same time) from a reader goroutine.
type chunkSource struct {
	r     io.Reader
	ch    chan chunk
	ended bool
	bufs  *hcm.BufferPool
	buf   *[]byte // the direct reads' buffer, reused: a chunk is consumed before the next
}

// release gives the read buffer back once the body is over and its last chunk consumed.
func (c *chunkSource) release() {
	if c.buf != nil {
		c.bufs.Put(c.buf)
		c.buf = nil
	}
}

func (c *chunkSource) next(ctx context.Context) chunk {
	if c.ended {
		return chunk{eof: true}
	}
	if c.ch != nil {
		select {
		case ch, ok := <-c.ch:
			if !ok {
				c.ended = true
				return chunk{eof: true}
			}
			if ch.eof || ch.err != nil {
				c.ended = true
			}
			return ch
		case <-ctx.Done():
			c.ended = true
			return chunk{err: ctx.Err()}
		}
	}
	if c.buf == nil {
		c.buf = c.bufs.Get()
	}
	buf := *c.buf
	n, err := c.r.Read(buf)
	ch := chunk{data: buf[:n]}
	switch {
	case err == io.EOF:
		ch.eof = true
		c.ended = true
	case err != nil:
		ch.err = err
		c.ended = true
	}
	return ch
}

// async moves the source onto a reader goroutine (owned by ctx, reading at most one chunk
// ahead) so that chunks can be waited for together with the filter's signals.
func (c *chunkSource) async(ctx context.Context) <-chan chunk {
	if c.ch != nil || c.ended {
		return c.ch
	}
	ch := make(chan chunk)
	c.ch = ch
	r := c.r
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, chunkSize)
			n, err := r.Read(buf)
			ck := chunk{data: buf[:n]}
			if err == io.EOF {
				ck.eof = true
			} else if err != nil {
				ck.err = err
			}
			select {
			case ch <- ck:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// direction is the request or the response side of a stream.
type direction struct {
	typ    host.StreamType
	onBody func(ctx context.Context, chunk []byte, eos bool) host.Result
}

func (f *filter) requestDir() direction {
	return direction{typ: host.StreamRequest, onBody: f.stream.OnRequestBody}
}

func (f *filter) responseDir() direction {
	return direction{typ: host.StreamResponse, onBody: f.stream.OnResponseBody}
}

// waitOutcome is how a wait for a paused filter ended.
type waitOutcome int

const (
	waitContinue waitOutcome = iota // go on, forwarding the returned body
	waitAnswered                    // the filter answered (local reply, close, downstream gone)
	waitTooLarge                    // the filter buffered more than the limit
)

// pausedWithBody runs while the filter paused its headers and the body is still arriving:
// as in Envoy, the body keeps coming to the filter (buffered while it pauses) until a body
// callback continues, the filter resumes (proxy_continue_stream), answers, or the buffer
// limit is exceeded. It returns the body to forward first.
func (f *filter) pausedWithBody(s *hcm.Stream, src *chunkSource, dir direction) ([]byte, waitOutcome) {
	ctx := s.Context()
	chunks := src.async(ctx)
	buffered := 0
	for {
		select {
		case <-ctx.Done():
			s.Info.AddFlag(streaminfo.DownstreamConnectionTermination)
			return nil, waitAnswered
		case sig := <-f.signals:
			switch f.signal(s, sig) {
			case sigContinue:
				return f.stream.TakeBufferedBody(dir.typ), waitContinue
			case sigGone:
				return f.stream.TakeBufferedBody(dir.typ), waitContinue
			default:
				return nil, waitAnswered
			}
		case ck, ok := <-chunks:
			if !ok {
				chunks = nil
				continue
			}
			if ck.err != nil {
				return nil, waitAnswered
			}
			if ck.eof {
				src.ended = true
				chunks = nil
			}
			res := dir.onBody(ctx, ck.data, ck.eof)
			if res.Skipped || f.gone {
				return ck.data, waitContinue
			}
			if f.answered(s, res) {
				return nil, waitAnswered
			}
			if f.gone || res.Action == host.Continue {
				return res.Body, waitContinue
			}
			buffered += len(ck.data)
			if buffered > s.BufferLimit() {
				return nil, waitTooLarge
			}
		}
	}
}

// signal handles a signal that arrived while waiting.
type sigResult int

const (
	sigContinue sigResult = iota
	sigGone
	sigAnswered
)

func (f *filter) signal(s *hcm.Stream, sig host.Signal) sigResult {
	switch sig.Kind {
	case host.SignalContinue:
		return sigContinue
	case host.SignalLocalResponse:
		f.localReply(s, sig.LocalResponse)
		return sigAnswered
	case host.SignalFailed:
		f.cfg.failures.Inc()
		if sig.LocalResponse != nil {
			f.localReply(s, sig.LocalResponse)
			return sigAnswered
		}
		f.gone = true
		return sigGone
	case host.SignalClose:
		s.SendLocalReply(http.StatusServiceUnavailable, "", nil, "wasm_close_stream", streaminfo.LocalReset)
		return sigAnswered
	}
	return sigContinue
}

// answered applies a callback's failure or local reply; it reports whether the stream
// was answered.
func (f *filter) answered(s *hcm.Stream, res host.Result) bool {
	if res.Failure != nil {
		f.cfg.failures.Inc()
		if res.LocalResponse == nil {
			f.gone = true
			return false
		}
	}
	if res.LocalResponse != nil {
		f.localReply(s, res.LocalResponse)
		return true
	}
	return false
}

// bodyFilter is a body on its way through the filter while the stream is already
// flowing: every chunk goes to the guest; while the guest pauses, chunks accumulate (up to
// the buffer limit) and, at the end of the stream, the filter waits for the guest to
// resume. A local reply from the guest interrupts the stream (request side) or resets it
// (response side, whose headers are already sent).
type bodyFilter struct {
	f        *filter
	s        *hcm.Stream
	src      *chunkSource
	dir      direction
	closer   io.Closer
	pending  []byte
	done     bool
	buffered int
	// atEnd runs before the last chunk goes to the guest; it reports whether trailers
	// follow (then the chunk is not the end of the stream).
	atEnd func() bool
	err   error
}

func (b *bodyFilter) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		if b.done {
			return 0, io.EOF
		}
		b.fill()
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	if len(b.pending) == 0 && b.done {
		b.src.release()
	}
	return n, nil
}

func (b *bodyFilter) fail(err error) {
	b.err = err
	if b.dir.typ == host.StreamResponse {
		b.s.Info.AddFlag(streaminfo.LocalReset)
	}
}

func (b *bodyFilter) fill() {
	f, s := b.f, b.s
	ctx := s.Context()
	ck := b.src.next(ctx)
	if ck.err != nil {
		b.err = ck.err
		return
	}
	eos := ck.eof
	if eos {
		b.done = true
		if b.atEnd != nil && b.atEnd() {
			eos = false
		}
	}
	if f.gone {
		b.pending = ck.data
		return
	}
	if len(ck.data) == 0 && !ck.eof {
		return
	}
	res := b.dir.onBody(ctx, ck.data, eos)
	switch {
	case res.Skipped:
		b.pending = ck.data
		return
	case res.LocalResponse != nil || res.Failure != nil:
		if !f.answeredMidStream(s, res, b.dir) {
			b.pending = ck.data
			return
		}
		b.fail(hcm.ErrInterrupted)
		return
	case res.Action == host.Continue:
		b.pending = res.Body
		b.buffered = 0
		return
	}
	b.buffered += len(ck.data)
	if b.buffered > s.BufferLimit() {
		f.tooLarge(s, b.dir, true)
		b.fail(errTooLarge)
		return
	}
	if !ck.eof {
		return
	}
	// The whole body is in and the guest still pauses: wait for it.
	select {
	case <-ctx.Done():
		b.err = ctx.Err()
	case sig := <-f.signals:
		switch f.signalMidStream(s, sig, b.dir) {
		case sigAnswered:
			b.fail(hcm.ErrInterrupted)
		default:
			b.pending = f.stream.TakeBufferedBody(b.dir.typ)
		}
	}
}

// answeredMidStream applies a failure or local reply from a body callback after the
// stream started flowing; it reports whether the stream was answered.
func (f *filter) answeredMidStream(s *hcm.Stream, res host.Result, dir direction) bool {
	if res.Failure != nil {
		f.cfg.failures.Inc()
		if res.LocalResponse == nil {
			f.gone = true
			return false
		}
	}
	f.interrupt(s, res.LocalResponse, dir)
	return true
}

func (f *filter) signalMidStream(s *hcm.Stream, sig host.Signal, dir direction) sigResult {
	switch sig.Kind {
	case host.SignalLocalResponse:
		f.interrupt(s, sig.LocalResponse, dir)
		return sigAnswered
	case host.SignalFailed:
		f.cfg.failures.Inc()
		if sig.LocalResponse != nil {
			f.interrupt(s, sig.LocalResponse, dir)
			return sigAnswered
		}
		f.gone = true
		return sigGone
	case host.SignalClose:
		if dir.typ == host.StreamRequest {
			s.Interrupt(http.StatusServiceUnavailable, "", nil, "wasm_close_stream", streaminfo.LocalReset, -1)
		}
		return sigAnswered
	}
	return sigContinue
}

// interrupt answers the stream from the request body; on the response side the headers
// already went out and the stream can only be reset.
func (f *filter) interrupt(s *hcm.Stream, lr *host.LocalResponse, dir direction) {
	if dir.typ != host.StreamRequest || lr == nil {
		return
	}
	h := http.Header{}
	for _, kv := range lr.Headers {
		h.Add(kv[0], kv[1])
	}
	s.Interrupt(lr.StatusCode, string(lr.Body), h, lr.Details, 0, int(lr.GRPCStatus))
}

// tooLarge answers a stream whose filter buffered more than the limit, as Envoy does: 413
// for a request, 500 for a response whose headers have not gone out (reset otherwise).
func (f *filter) tooLarge(s *hcm.Stream, dir direction, flowing bool) {
	if dir.typ == host.StreamRequest {
		if flowing {
			s.Interrupt(http.StatusRequestEntityTooLarge, "Payload Too Large", nil, "request_payload_too_large", 0, -1)
		} else {
			s.SendLocalReply(http.StatusRequestEntityTooLarge, "Payload Too Large", nil, "request_payload_too_large", 0)
		}
		return
	}
	if !flowing {
		s.SendLocalReply(http.StatusInternalServerError, "Internal Server Error", nil, "response_payload_too_large", 0)
	}
}

func (b *bodyFilter) Close() error {
	if b.closer != nil {
		return b.closer.Close()
	}
	return nil
}
