package host

import (
	"bytes"
	"fmt"
)

// A Failure quotes at most stderrHead bytes from the start of what the guest wrote during
// the callback, where Go prints "panic: <message>" and the head of the goroutine's trace,
// and stderrTail bytes from its end, where output written before a panic ends and a long
// trace (a stack overflow's) finishes.
const (
	stderrHead = 1 << 10
	stderrTail = 3 << 10
)

// outputCapture keeps the beginning and the end of what a guest writes between resets.
// It is only used with the VM's instance entered.
type outputCapture struct {
	head, tail []byte
	// total counts the bytes written since the last reset.
	total int
}

func (c *outputCapture) Write(p []byte) (int, error) {
	c.total += len(p)
	b := p
	if room := stderrHead - len(c.head); room > 0 {
		n := min(room, len(b))
		c.head = append(c.head, b[:n]...)
		b = b[n:]
	}
	c.tail = append(c.tail, b...)
	// Only the last stderrTail bytes are kept; moving them down once the buffer has twice
	// that keeps a guest that writes on every request from copying on every write.
	if len(c.tail) > 2*stderrTail {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-stderrTail:]...)
	}
	return len(p), nil
}

// reset forgets what was written, keeping the buffers.
func (c *outputCapture) reset() {
	c.head, c.tail, c.total = c.head[:0], c.tail[:0], 0
}

// String is the output kept, with the number of bytes left out between its start and end;
// when some are, the start and the end are cut at line ends.
func (c *outputCapture) String() string {
	head, tail := c.head, c.tail[max(0, len(c.tail)-stderrTail):]
	if c.total == len(head)+len(tail) {
		return string(head) + string(tail)
	}
	if i := bytes.LastIndexByte(head, '\n'); i >= 0 {
		head = head[:i+1]
	}
	if i := bytes.IndexByte(tail, '\n'); i >= 0 {
		tail = tail[i+1:]
	}
	omitted := c.total - len(head) - len(tail)
	return fmt.Sprintf("%s\n... (%d bytes omitted) ...\n%s", bytes.TrimSuffix(head, []byte("\n")), omitted, tail)
}
