package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"
)

// h1Pool is the cluster's HTTP/1.1 connection pool: keep-alive connections per host,
// used by one request at a time, the way Envoy's HTTP/1 pool works. Unlike net/http's
// Transport it runs a request on the caller's goroutine (a request without a body is
// written and its response read without handing off to per-connection goroutines), which
// takes two goroutine wake-ups off every request.
type h1Pool struct {
	c           *Cluster
	idleTimeout time.Duration

	mu     sync.Mutex
	idle   map[string][]*h1Conn
	closed bool
	// present are the cluster's current addresses (nil before the first host set): a
	// connection to any other is closed when it becomes idle, as Envoy drains the
	// connection pool of a removed host.
	present map[string]bool

	// The connections' buffers, kept while connections come and go.
	readers, writers sync.Pool
}

type h1Conn struct {
	pool   *h1Pool
	conn   net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	addr   string
	idleAt time.Time
}

// maxIdlePerHost bounds the idle connections kept per host.
const maxIdlePerHost = 1024

func newH1Pool(c *Cluster, idle time.Duration) *h1Pool {
	p := &h1Pool{c: c, idleTimeout: idle, idle: map[string][]*h1Conn{}}
	p.readers.New = func() any { return bufio.NewReaderSize(nil, 4096) }
	p.writers.New = func() any { return bufio.NewWriterSize(nil, 4096) }
	return p
}

// get returns an idle connection to addr (most recently used first), or nil.
func (p *h1Pool) get(addr string) *h1Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.idle[addr]
	for len(list) > 0 {
		pc := list[len(list)-1]
		list = list[:len(list)-1]
		if p.idleTimeout > 0 && time.Since(pc.idleAt) > p.idleTimeout {
			go pc.close() // idle_timeout passed
			continue
		}
		p.idle[addr] = list
		return pc
	}
	delete(p.idle, addr)
	return nil
}

// put keeps a connection whose last response was read in full.
func (p *h1Pool) put(pc *h1Conn) {
	pc.idleAt = time.Now()
	p.mu.Lock()
	if p.closed || (p.present != nil && !p.present[pc.addr]) || len(p.idle[pc.addr]) >= maxIdlePerHost {
		p.mu.Unlock()
		pc.close()
		return
	}
	p.idle[pc.addr] = append(p.idle[pc.addr], pc)
	p.mu.Unlock()
}

func (pc *h1Conn) close() {
	_ = pc.conn.Close()
	pc.release()
}

// closeAfterWrite closes the connection and, once a request body writer still running on
// it has stopped, gives its buffers back.
func (pc *h1Conn) closeAfterWrite(writeDone chan error) {
	_ = pc.conn.Close()
	if writeDone == nil {
		pc.release()
		return
	}
	go func() {
		<-writeDone
		pc.release()
	}()
}

func (pc *h1Conn) release() {
	if pc.br != nil {
		pc.br.Reset(nil)
		pc.pool.readers.Put(pc.br)
		pc.br = nil
	}
	if pc.bw != nil {
		pc.bw.Reset(nil)
		pc.pool.writers.Put(pc.bw)
		pc.bw = nil
	}
}

// setHosts records the cluster's current addresses: the idle connections to an address
// that left are closed now, its busy ones once their request is done.
func (p *h1Pool) setHosts(present map[string]bool) {
	var closing []*h1Conn
	p.mu.Lock()
	p.present = present
	for addr, list := range p.idle {
		if !present[addr] {
			closing = append(closing, list...)
			delete(p.idle, addr)
		}
	}
	p.mu.Unlock()
	for _, pc := range closing {
		pc.close()
	}
}

// closeIdle closes the idle connections (cluster removed or replaced).
func (p *h1Pool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = map[string][]*h1Conn{}
	p.closed = true
	p.mu.Unlock()
	for _, list := range idle {
		for _, pc := range list {
			pc.close()
		}
	}
}

func (p *h1Pool) dial(ctx context.Context, h *Host) (*h1Conn, error) {
	addr := h.Address
	conn, err := p.c.dial(ctx, h, false)
	if err != nil {
		return nil, err
	}
	br := p.readers.Get().(*bufio.Reader)
	br.Reset(conn)
	bw := p.writers.Get().(*bufio.Writer)
	bw.Reset(conn)
	return &h1Conn{pool: p, conn: conn, br: br, bw: bw, addr: addr}, nil
}

// errRetryFresh marks a failure on a reused connection before any response byte: the
// server had closed it while idle, so the request never reached it.
var errRetryFresh = errors.New("reused connection closed by the upstream")

// roundTrip sends req to addr over a pooled connection. A request without a body is
// tried again when a reused connection turns out to be closed, as net/http's Transport
// does for requests that were not processed, and on a new connection: the pool does not
// watch its idle connections (Envoy's sees their close and drops them), and a peer that
// closed one, draining, has most likely closed the others too.
func (p *h1Pool) roundTrip(req *http.Request, h *Host) (*http.Response, error) {
	addr := h.Address
	for attempt := 0; ; attempt++ {
		var pc *h1Conn
		if attempt == 0 {
			pc = p.get(addr)
		}
		reused := pc != nil
		if pc == nil {
			var err error
			if pc, err = p.dial(req.Context(), h); err != nil {
				return nil, err
			}
		}
		resp, err := p.send(pc, req, reused)
		if errors.Is(err, errRetryFresh) && attempt == 0 && (req.Body == nil || req.Body == http.NoBody) {
			continue
		}
		return resp, err
	}
}

func (p *h1Pool) send(pc *h1Conn, req *http.Request, reused bool) (*http.Response, error) {
	ctx := req.Context()
	if trace := httptrace.ContextClientTrace(ctx); trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: pc.conn, Reused: reused})
	}
	// Cancellation (timeouts, the downstream going away) closes the connection, which
	// unblocks whatever reads or writes it.
	stop := context.AfterFunc(ctx, func() { _ = pc.conn.Close() })
	hasBody := req.Body != nil && req.Body != http.NoBody
	var writeDone chan error
	if hasBody {
		// The body is written while the response is read: an upstream may answer before
		// it has the whole request (and a streaming request never ends first).
		writeDone = make(chan error, 1)
		body := &trackedBody{rc: req.Body}
		out := *req
		out.Body = body
		go func() {
			err := out.Write(pc.bw)
			if err == nil {
				err = pc.bw.Flush()
			}
			if body.err != nil {
				// The request body broke off (the downstream, or a filter answering the
				// stream): the upstream would wait for the rest forever.
				_ = pc.conn.Close()
			}
			writeDone <- err
		}()
	} else {
		err := req.Write(pc.bw)
		if err == nil {
			err = pc.bw.Flush()
		}
		if err != nil {
			stop()
			pc.close()
			if reused && ctx.Err() == nil {
				return nil, errRetryFresh
			}
			return nil, p.ctxErr(ctx, err)
		}
	}
	var resp *http.Response
	var err error
	for {
		resp, err = http.ReadResponse(pc.br, req)
		if err != nil || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		// 1xx informational responses are not passed on.
		_ = resp.Body.Close()
	}
	if err == nil && ctx.Err() != nil {
		// Cancelled while the answer came: over TLS, closing sends close_notify before the
		// socket closes, and a peer that sees it may still write a response (Go's HTTP
		// server answers an abandoned request 200 with no body) that this read then takes.
		// A response read after the cancellation is not the upstream's answer.
		_ = resp.Body.Close()
		err = ctx.Err()
	}
	if err != nil {
		stop()
		pc.closeAfterWrite(writeDone)
		if reused && ctx.Err() == nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err)) {
			return nil, errRetryFresh
		}
		return nil, p.ctxErr(ctx, err)
	}
	keep := !resp.Close && resp.ProtoAtLeast(1, 1) && !req.Close
	resp.Body = &h1Body{rc: resp.Body, pool: p, pc: pc, stop: stop, keep: keep, writeDone: writeDone,
		eof: resp.Body == http.NoBody}
	return resp, nil
}

// ctxErr prefers the context's error: a closed connection is how cancellation shows.
func (p *h1Pool) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// h1Body is a pooled response body: read to its end (and with the request written in
// full), the connection goes back to the pool; closed early, it is closed.
type h1Body struct {
	rc        io.ReadCloser
	pool      *h1Pool
	pc        *h1Conn
	stop      func() bool
	keep      bool
	writeDone chan error
	eof       bool
	once      sync.Once
}

func (b *h1Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *h1Body) Close() error {
	err := b.rc.Close()
	b.once.Do(func() {
		reuse := b.eof && b.keep
		writeDone := b.writeDone
		if writeDone != nil {
			select {
			case werr := <-writeDone:
				reuse = reuse && werr == nil
				writeDone = nil
			default:
				// The request body is still being written: the connection cannot be reused.
				reuse = false
			}
		}
		if !b.stop() {
			reuse = false // cancelled: the connection is closed
		}
		if reuse {
			b.pool.put(b.pc)
			return
		}
		b.pc.closeAfterWrite(writeDone)
	})
	return err
}

// trackedBody records a request body's read error, to tell it from a write error.
type trackedBody struct {
	rc  io.ReadCloser
	err error
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func (b *trackedBody) Close() error { return b.rc.Close() }
