package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// Connection is one ADS stream from a proxy.
type Connection struct {
	ID          string
	Proxy       *model.Proxy
	ConnectedAt time.Time
	// Caller is who opened the stream on the secure port ("" on the plaintext port).
	Caller string

	srv *Server
	// gen is the proxy as the generator knows it: what it watches, what it gets.
	gen ProxyWatch
	// resumed: the proxy came with config from an earlier connection (a SotW version or
	// delta initial versions on its first request), i.e. it was already serving.
	resumed bool
	// holdUntil: no updates are sent before (see Options.ReconnectWindow).
	holdUntil time.Time
	workload  *model.Workload
	delta     bool
	// push sends a push event on the connection's stream (set by serve).
	push func(*pusher.Event) error
	// stopped is closed when the stream's handler ends; ended asks it to end (a send
	// that timed out), with endErr as the stream's error.
	stopped chan struct{}
	ended   chan struct{}
	endOnce sync.Once
	endErr  error

	// turn serializes the connection's work, as one goroutine per stream would without a
	// hand-off: requests run in the stream's reader, pushes in the push worker that
	// dequeued the connection, one at a time. closed (under turn) stops both once the
	// stream has ended.
	turn   sync.Mutex
	closed bool
	// sendTimer ends the connection when a send takes longer than SendTimeout: one timer,
	// re-armed for each send (under turn); sendTimedOut once it has fired.
	sendTimer    *time.Timer
	sendTimedOut bool

	mu      sync.Mutex
	watches map[string]*watch
	// lastNack is the latest NACK message logged, so a proxy repeating it is logged once.
	lastNack string
	// admitted frees the connection's admission slot (nil once freed): when its initial
	// clusters and listeners are sent, or it closes.
	admitted func()
}

// watch is the protocol state of one resource type on one connection (what it watches is
// the generator's, gen).
type watch struct {
	wildcard bool
	// known is what the proxy has been sent, as far as the server knows: the base for
	// skipping unchanged types and for delta diffs.
	known *xds.Resources

	nonceSent, versionSent   string
	nonceAcked, versionAcked string
	nackVersion, nackError   string
	sent, acks, nacks        int
	lastSent                 time.Time
}

// TypeStatus is one type's sync state, for /debug/syncz.
type TypeStatus struct {
	Type          string `json:"type"`
	Resources     int    `json:"resources"`
	Subscribed    int    `json:"subscribed,omitempty"`
	VersionSent   string `json:"versionSent,omitempty"`
	NonceSent     string `json:"nonceSent,omitempty"`
	VersionAcked  string `json:"versionAcked,omitempty"`
	NonceAcked    string `json:"nonceAcked,omitempty"`
	VersionNacked string `json:"versionNacked,omitempty"`
	NackError     string `json:"nackError,omitempty"`
	Sent          int    `json:"sent"`
	Acks          int    `json:"acks"`
	Nacks         int    `json:"nacks"`
}

// SyncStatus reports every watched type, in push order.
func (c *Connection) SyncStatus() []TypeStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []TypeStatus
	for _, typ := range xds.PushOrder {
		w := c.watches[typ]
		if w == nil {
			continue
		}
		st := TypeStatus{Type: xds.ShortType(typ), VersionSent: w.versionSent, NonceSent: w.nonceSent,
			VersionAcked: w.versionAcked, NonceAcked: w.nonceAcked, VersionNacked: w.nackVersion, NackError: w.nackError,
			Sent: w.sent, Acks: w.acks, Nacks: w.nacks, Subscribed: c.gen.Subscribed(typ)}
		if w.known != nil {
			st.Resources = len(w.known.Items)
		}
		out = append(out, st)
	}
	return out
}

// Delta reports whether the connection uses incremental xDS.
func (c *Connection) Delta() bool { return c.delta }

// Push implements pusher.Watcher: the push waits in the queue for a worker.
func (c *Connection) Push(ev *pusher.Event) { c.srv.queue.Enqueue(c, ev) }

// subscribe replaces what a watch names (caller holds c.mu); what the proxy knows of the
// names it drops is forgotten.
func (c *Connection) subscribe(typ string, w *watch, names []string) {
	c.gen.Subscribe(typ, false, names)
	if w.known != nil {
		w.known = xds.Select(w.known, c.gen.Names(typ))
	}
}

var errSendTimeout = errors.New("send timed out")

// sendWithTimeout runs one stream send (the caller holds the turn); a proxy that does not
// read within the timeout is cut off, so one slow client cannot hold a push worker: the
// timer ends the stream's handler, whose return cancels the stream's context, which
// unblocks the stuck send.
func (c *Connection) sendWithTimeout(send func() error) error {
	timeout := c.srv.opts.SendTimeout
	if timeout <= 0 {
		return send()
	}
	switch {
	case c.sendTimedOut:
		return errSendTimeout
	case c.sendTimer == nil:
		c.sendTimer = time.AfterFunc(timeout, func() {
			c.srv.metrics.WriteTimeouts.Inc()
			c.srv.log.Warn("send timed out; closing connection", "conn", c.ID, "timeout", timeout)
			c.end(errSendTimeout)
		})
	default:
		c.sendTimer.Reset(timeout)
	}
	err := send()
	if !c.sendTimer.Stop() {
		c.sendTimedOut = true
		return errSendTimeout
	}
	return err
}

// end asks the stream's handler to return err; the first call wins.
func (c *Connection) end(err error) {
	c.endOnce.Do(func() {
		c.endErr = err
		close(c.ended)
	})
}

// runPush sends a push, in the calling push worker; an error ends the stream.
func (c *Connection) runPush(ev *pusher.Event) {
	c.turn.Lock()
	defer c.turn.Unlock()
	if c.closed {
		return
	}
	if err := c.push(ev); err != nil {
		c.end(err)
	}
}

// recordSent updates a watch after a send.
func (c *Connection) recordSent(typ string, w *watch, nonce, version string, known *xds.Resources, bytes int) {
	c.mu.Lock()
	w.nonceSent, w.versionSent, w.known = nonce, version, known
	w.sent++
	w.lastSent = time.Now()
	c.initialDone()
	c.mu.Unlock()
	c.srv.bytesSent.Add(uint64(bytes))
	c.srv.metrics.Pushes.WithLabelValues(xds.ShortType(typ)).Inc()
	c.srv.metrics.ConfigSize.WithLabelValues(xds.ShortType(typ)).Observe(float64(bytes))
}

// recordAck handles the nonce and error of a request; it reports whether the request
// answered the latest response (stale nonces are ignored, Istio's rule).
func (c *Connection) recordAck(typ string, w *watch, nonce, version string, errDetail string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nonce != w.nonceSent {
		c.srv.metrics.ExpiredNonce.WithLabelValues(xds.ShortType(typ)).Inc()
		return false
	}
	if errDetail != "" {
		w.nacks++
		w.nackVersion, w.nackError = w.versionSent, errDetail
		c.srv.metrics.Rejects.WithLabelValues(xds.ShortType(typ)).Inc()
		if errDetail != c.lastNack {
			c.lastNack = errDetail
			c.srv.log.Warn("proxy rejected config (NACK); it keeps its last accepted config", "conn", c.ID,
				"type", xds.ShortType(typ), "version", w.versionSent, "error", errDetail)
		}
		return true
	}
	w.acks++
	w.nonceAcked, w.versionAcked = nonce, version
	if w.versionAcked == w.nackVersion {
		w.nackError = ""
	}
	return true
}

// newConnection admits and identifies a new stream.
func (s *Server) newConnection(ctx context.Context, node *core.Node, caller Caller, delta bool) (*Connection, error) {
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	c, err := s.identify(node, caller, delta)
	if err != nil {
		release()
		return nil, err
	}
	c.holdAdmission(release)
	return c, nil
}

// identify makes a connection of a new stream's first node.
func (s *Server) identify(node *core.Node, caller Caller, delta bool) (*Connection, error) {
	p, err := model.ParseNode(node)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// Before anything is registered or generated for it (Istio authorizes in initConnection).
	if err := authorize(caller, p); err != nil {
		return nil, err
	}
	if !s.Ready() {
		return nil, status.Error(codes.Unavailable, "server is not ready")
	}
	c := &Connection{
		ID: fmt.Sprintf("%s-%d", p.ID, s.connSeq.Add(1)), Proxy: p, ConnectedAt: time.Now(), srv: s, delta: delta, Caller: callerName(caller),
		stopped: make(chan struct{}), ended: make(chan struct{}), watches: map[string]*watch{},
	}
	if w, ok := p.Workload(); ok {
		c.workload = w
	}
	return c, nil
}

// closeConnection retires a connection whose handler is returning. Its proxy leaves the
// generator once the turn is free: a send stuck on the stream holds it until the handler's
// return cancels the stream, and a push under way reads what the proxy watches.
func (s *Server) closeConnection(c *Connection) {
	close(c.stopped)
	c.mu.Lock()
	c.freeAdmission()
	c.mu.Unlock()
	s.queue.Remove(c)
	s.removeConnection(c)
	go func() {
		c.turn.Lock()
		defer c.turn.Unlock()
		c.closed = true
		c.gen.Close()
	}()
}

// isClosed reports whether err only means the stream ended.
func isClosed(err error) bool {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return true
	}
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded:
		return true
	}
	return false
}

// observeConvergence records a completed push to one proxy.
func (c *Connection) observeConvergence(ev *pusher.Event) {
	if !ev.Start().IsZero() {
		c.srv.metrics.ConvergenceTime.Observe(time.Since(ev.Start()).Seconds())
	}
}

// request is what serve reads of a request of either variant.
type request interface {
	GetNode() *core.Node
	GetTypeUrl() string
	GetErrorDetail() *statuspb.Status
}

// stream is what serve needs of an ADS stream of either variant.
type stream[Req any] interface {
	Context() context.Context
	Recv() (Req, error)
}

// errNoType ends a stream whose request names no type: on an aggregated stream the type URL
// says what a request asks for or answers (go-control-plane's ADS refuses it alike).
var errNoType = status.Error(codes.InvalidArgument, "type URL is required for ADS")

// serve runs one ADS stream: the first request identifies and admits the proxy; then the
// stream's requests are handled by a reader goroutine (a blocking Recv cannot be selected
// on, and the handler must stay free to end the stream) and pushes by the push workers,
// one at a time under the connection's turn, until the stream or the server ends.
func serve[Req request](s *Server, st stream[Req], caller Caller, delta bool, resumed func(Req) bool,
	onRequest func(*Connection, Req) error, onPush func(*Connection, *pusher.Event) error) error {
	first, err := st.Recv()
	if err != nil {
		if isClosed(err) {
			return nil
		}
		return err
	}
	if first.GetTypeUrl() == "" {
		return errNoType
	}
	if first.GetTypeUrl() == HealthType {
		return s.serveHealth(first.GetNode(), caller, first, func() (healthReport, error) { return st.Recv() })
	}
	c, err := s.newConnection(st.Context(), first.GetNode(), caller, delta)
	if err != nil {
		return err
	}
	c.push = func(ev *pusher.Event) error { return onPush(c, ev) }
	c.resumed = resumed(first)
	if c.resumed {
		if until := s.holdResumed(); !until.IsZero() {
			c.holdUntil = until
			// Nothing is sent to it before then: it takes no admission slot meanwhile.
			c.freeAdmission()
			s.log.Info("proxy resumed with its config after a restart; holding its updates", "conn", c.ID, "until", until)
			go s.releaseHeld(c, until)
		}
	}
	s.addConnection(c)
	defer s.closeConnection(c)

	errs := make(chan error, 1)
	go func() {
		handle := func(r Req) error {
			c.turn.Lock()
			defer c.turn.Unlock()
			if c.closed {
				return context.Canceled
			}
			if r.GetTypeUrl() == "" {
				return errNoType
			}
			return onRequest(c, r)
		}
		for r := first; ; {
			if err := handle(r); err != nil {
				errs <- err
				return
			}
			if r, err = st.Recv(); err != nil {
				errs <- err
				return
			}
		}
	}()
	select {
	case err := <-errs:
		if isClosed(err) {
			return nil
		}
		return err
	case <-c.ended:
		return c.endErr
	case <-s.stop:
		return nil
	}
}

// HealthType is the type of the requests an agent reports its workload's health with
// (Istio's HealthInfoType; docs/contracts.md, "Workload health").
const HealthType = "istio.io/health"

// healthReport is a health request of either variant.
type healthReport interface {
	GetTypeUrl() string
	GetErrorDetail() *statuspb.Status
}

// serveHealth reads an agent's health reports: no error detail means healthy. The stream
// gets no responses and is not a proxy connection.
func (s *Server) serveHealth(node *core.Node, caller Caller, first healthReport, recv func() (healthReport, error)) error {
	p, err := model.ParseNode(node)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if err := authorize(caller, p); err != nil {
		return err
	}
	w, ok := p.Workload()
	if !ok || s.deps.AutoRegistration == nil {
		return status.Error(codes.InvalidArgument, "health reports need workload metadata (NAME, NAMESPACE, LABELS, INSTANCE_IPS)")
	}
	for r := first; ; {
		if r.GetTypeUrl() == HealthType {
			s.deps.AutoRegistration.SetHealth(w.Namespace, w.Name, r.GetErrorDetail() == nil, r.GetErrorDetail().GetMessage())
		}
		r, err = recv()
		if err != nil {
			if isClosed(err) {
				return nil
			}
			return err
		}
	}
}

// held reports whether the connection gets no updates yet (see Options.ReconnectWindow).
func (c *Connection) held() bool { return !c.holdUntil.IsZero() && time.Now().Before(c.holdUntil) }
