package wasmfilter

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/httpfilter"
)

// chunkSize is how much body one read of the goroutine reader takes.
const chunkSize = hcm.BodyBufferSize

var errResponseReset = errors.New("response reset by a wasm filter")

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
	// trailers, if set, returns the trailers that follow the body's end (nil for none).
	trailers func() *host.Headers
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

// step runs one event on the stream's filter and takes what it let go on in dir. The
// request body may be read on the upstream's goroutine while the response is on its way,
// so the filter's events are serialized.
func (f *filter) step(dir host.StreamType, event func() httpfilter.Verdict) (httpfilter.Verdict, httpfilter.Out) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return event(), f.fm.Take(dir)
}

// state reports whether the filter holds some of dir, whether it takes more of it, and
// whether the stream was decided so that it takes none.
func (f *filter) state(dir host.StreamType) (held, accepting, closed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fm.Held(dir), f.fm.Accepting(dir), f.fm.Closed(dir)
}

// feed gives the filter one chunk of dir's input and, after the last one, the trailers.
func (f *filter) feed(ctx context.Context, dir host.StreamType, src *chunkSource, ck chunk) (httpfilter.Verdict, httpfilter.Out) {
	var t *host.Headers
	if ck.eof {
		src.ended = true
		if src.trailers != nil {
			t = src.trailers()
		}
	}
	return f.step(dir, func() httpfilter.Verdict {
		v := f.fm.Data(ctx, dir, ck.data, ck.eof && t == nil)
		if t != nil && v.Kind == httpfilter.Proceed {
			v = f.fm.Trailers(ctx, dir, t)
		}
		return v
	})
}

// until is what a wait for the guest waits for.
type until uint8

const (
	untilHeaders   until = iota // the direction's headers go on
	untilFree                   // the filter holds nothing of the direction
	untilAccepting              // the filter takes more input (or holds nothing)
)

// await waits for the guest while the filter holds direction dir, until u: it applies the
// guest's signals and, while the filter takes them, feeds it src's chunks (src may be nil).
// It returns how the stream was decided meanwhile, what the filter let go on (added to
// out), and an error when the downstream went away, or its body broke, first.
func (f *filter) await(ctx context.Context, src *chunkSource, dir host.StreamType, out httpfilter.Out, u until) (httpfilter.Verdict, httpfilter.Out, error) {
	add := func(v httpfilter.Verdict, o httpfilter.Out) httpfilter.Verdict {
		out.Headers, out.Trailers, out.End = out.Headers || o.Headers, out.Trailers || o.Trailers, out.End || o.End
		out.Data = append(out.Data, o.Data...)
		return v
	}
	for {
		held, accepting, _ := f.state(dir)
		if u == untilHeaders && out.Headers || u != untilHeaders && !held || u == untilAccepting && accepting {
			return httpfilter.Verdict{}, out, nil
		}
		var chunks <-chan chunk
		if src != nil && accepting && !src.ended {
			chunks = src.async(ctx)
		}
		var v httpfilter.Verdict
		select {
		case <-ctx.Done():
			return v, out, ctx.Err()
		case sig := <-f.signals:
			v = add(f.step(dir, func() httpfilter.Verdict { return f.fm.Signal(ctx, sig) }))
		case ck, ok := <-chunks:
			switch {
			case !ok:
				src.ended = true
				continue
			case ck.err != nil:
				return v, out, ck.err
			case len(ck.data) == 0 && !ck.eof:
				continue
			}
			v = add(f.feed(ctx, dir, src, ck))
		}
		if v.Kind != httpfilter.Proceed {
			return v, out, nil
		}
	}
}

// answerHeaders answers a stream the filter decided while its headers waited: a local
// reply, or a reset, which meshproxy cannot do before a response exists: it answers 503
// with the reset's details and the LR flag instead.
func (f *filter) answerHeaders(s *hcm.Stream, v httpfilter.Verdict) {
	if v.Kind == httpfilter.Reset {
		s.SendLocalReply(http.StatusServiceUnavailable, "", nil, v.Details, streaminfo.LocalReset)
		return
	}
	lr := v.Reply
	s.SendLocalReplyGRPC(lr.StatusCode, string(lr.Body), replyHeader(lr), lr.Details, 0, int(lr.GRPCStatus))
}

func replyHeader(lr *host.LocalResponse) http.Header {
	h := http.Header{}
	for _, kv := range lr.Headers {
		h.Add(kv[0], kv[1])
	}
	return h
}

// abort ends a stream whose downstream went away (or whose body broke) while the filter
// held it.
func (f *filter) abort(s *hcm.Stream) {
	f.mu.Lock()
	f.fm.Abort()
	f.mu.Unlock()
	s.Info.AddFlag(streaminfo.DownstreamConnectionTermination)
	s.Response = &hcm.Response{Local: true}
}

// bodyFilter is a body on its way through the filter while the stream is already flowing:
// every chunk goes to the filter, and what it lets go on is read out; while it holds the
// body the reader waits for the guest once the body is all in (or the filter takes no more).
// A stream the filter answers meanwhile is interrupted (request side: the reply replaces
// the upstream's) or reset (response side, whose headers already went on).
type bodyFilter struct {
	f       *filter
	s       *hcm.Stream
	src     *chunkSource
	dir     host.StreamType
	closer  io.Closer
	pending []byte
	done    bool
	err     error
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
		// The end comes with the last bytes, as Envoy's codec ends a body whose length it
		// knows on its last data frame: the next filter gets that chunk with end_of_stream
		// instead of an empty callback after it.
		b.src.release()
		return n, io.EOF
	}
	return n, nil
}

func (b *bodyFilter) fill() {
	f, ctx := b.f, b.s.Context()
	if !b.src.ended {
		ck := b.src.next(ctx)
		if ck.err != nil {
			b.err = ck.err
			return
		}
		if len(ck.data) == 0 && !ck.eof {
			return
		}
		v, out := f.feed(ctx, b.dir, b.src, ck)
		b.pending = out.Data
		if b.answered(v) {
			return
		}
	}
	held, accepting, closed := f.state(b.dir)
	switch {
	case closed:
		// Decided elsewhere (the other direction's wait took the guest's signal).
		b.err = hcm.ErrInterrupted
		if b.dir == host.StreamResponse {
			b.err = errResponseReset
		}
	case held && (b.src.ended || !accepting):
		u := untilFree
		if !b.src.ended {
			u = untilAccepting
		}
		v, out, err := f.await(ctx, nil, b.dir, httpfilter.Out{}, u)
		b.pending = append(b.pending, out.Data...)
		if err != nil {
			b.err = err
			return
		}
		b.answered(v)
	case b.src.ended && !held:
		b.done = true
	}
}

// answered applies how the filter decided the stream while the body flowed; it reports
// whether it answered the stream, ending the body with an error.
func (b *bodyFilter) answered(v httpfilter.Verdict) bool {
	switch {
	case v.Kind == httpfilter.Proceed:
		return false
	case b.dir == host.StreamResponse:
		b.s.Info.AddFlag(streaminfo.LocalReset)
		b.err = errResponseReset
	case v.Kind == httpfilter.Reset:
		b.s.Interrupt(http.StatusServiceUnavailable, "", nil, v.Details, streaminfo.LocalReset, -1)
		b.err = hcm.ErrInterrupted
	default:
		lr := v.Reply
		b.s.Interrupt(lr.StatusCode, string(lr.Body), replyHeader(lr), lr.Details, 0, int(lr.GRPCStatus))
		b.err = hcm.ErrInterrupted
	}
	return true
}

func (b *bodyFilter) Close() error {
	if b.closer != nil {
		return b.closer.Close()
	}
	return nil
}
