package router

import (
	"errors"
	"io"
	"sync"

	"github.com/wasmesh/wasmesh/testenv/proxy/internal/latch"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

var (
	errBodyAbandoned = errors.New("request body no longer buffered (over the retry/shadow buffer limit)")
	errStaleAttempt  = errors.New("request body taken over by a newer attempt")
)

// requestBody is the downstream request body as the router reads it: counted into the
// stream info, reported as activity (idle timeout), completing the request at EOF, and,
// while retries or mirrors may need it again, kept (up to the buffer limit) so that every
// attempt and mirror reads it from the start through its own cursor. Over the limit the
// copy is abandoned (retry_or_shadow_abandoned) and only the current attempt goes on.
type requestBody struct {
	mu      sync.Mutex
	cond    *sync.Cond
	src     io.Reader
	info    *streaminfo.Info
	done    *latch.Latch
	touch   func()
	keep    bool
	limit   int
	buf     []byte
	eof     bool
	err     error
	reading bool
	// abandoned: buf is no longer complete; only the primary cursor may read past it.
	abandoned bool
	primary   *bodyCursor
	onAbandon func()
}

func newRequestBody(src io.Reader, info *streaminfo.Info, done *latch.Latch, touch func(), keep bool, limit int, onAbandon func()) *requestBody {
	b := &requestBody{src: src, info: info, done: done, touch: touch, keep: keep, limit: limit, onAbandon: onAbandon}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// cursor returns a reader of the body from its start. A primary cursor (an attempt's)
// replaces the previous primary, whose reads fail from then on.
func (b *requestBody) cursor(primary bool) *bodyCursor {
	c := &bodyCursor{b: b}
	if primary {
		b.mu.Lock()
		if b.primary != nil {
			b.primary.stale = true
		}
		b.primary = c
		b.cond.Broadcast()
		b.mu.Unlock()
	}
	return c
}

// replayable reports whether a new attempt can read the body from its start.
func (b *requestBody) replayable() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.keep && !b.abandoned
}

type bodyCursor struct {
	b     *requestBody
	off   int
	stale bool
}

func (c *bodyCursor) Read(p []byte) (int, error) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if c.stale {
			return 0, errStaleAttempt
		}
		if b.keep && !b.abandoned && c.off < len(b.buf) {
			n := copy(p, b.buf[c.off:])
			c.off += n
			return n, nil
		}
		if b.abandoned && (b.primary != c || c.off < len(b.buf)) {
			if b.primary == c && c.off < len(b.buf) {
				n := copy(p, b.buf[c.off:])
				c.off += n
				if c.off == len(b.buf) {
					b.buf = nil
					c.off = 0
				}
				return n, nil
			}
			return 0, errBodyAbandoned
		}
		if b.eof {
			return 0, io.EOF
		}
		if b.err != nil {
			return 0, b.err
		}
		if b.reading {
			b.cond.Wait()
			continue
		}
		b.reading = true
		b.mu.Unlock()
		n, err := b.src.Read(p)
		b.mu.Lock()
		b.reading = false
		b.cond.Broadcast()
		if n > 0 {
			b.info.AddBytes(uint64(n), 0)
			if b.touch != nil {
				b.touch()
			}
		}
		if err == io.EOF {
			b.eof = true
		} else if err != nil {
			b.err = err
		}
		if b.eof {
			defer b.done.Set()
		}
		if n == 0 {
			continue
		}
		if !b.keep || b.abandoned {
			// Nobody else will read these bytes again: hand them straight to the reader.
			if b.primary == c || !b.keep {
				return n, nil
			}
			return 0, errBodyAbandoned
		}
		b.buf = append(b.buf, p[:n]...)
		if len(b.buf) > b.limit {
			// Over the limit: the bytes just read stay for the current attempt to drain, but
			// nobody can start from the beginning again.
			b.abandoned = true
			if b.onAbandon != nil {
				defer b.onAbandon()
			}
		}
		continue
	}
}

// Close leaves the downstream body alone: the connection manager owns it.
func (c *bodyCursor) Close() error { return nil }
