// Package vmstate is the guest's context bookkeeping for proxy-wasm: which plugin (root)
// contexts exist, which HTTP and TCP stream contexts hang off them, which context is
// active, and which callback answers which outstanding HTTP call. It follows the
// semantics of proxy-wasm-go-sdk's internal/vmstate.go and abi_callback_*.go, so a filter
// behaves the same under this package as under the SDK, plus the handling of host calls
// that re-enter the guest (see Enter and DispatchHTTPCall).
//
// It is plain Go with no ABI code, so it is tested natively; the wasip1 ABI layer owns
// the one State and forwards every proxy_on_* callback to it.
package vmstate

import (
	"errors"
	"fmt"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// Host is the part of the host the bookkeeping itself calls.
type Host interface {
	// SetEffectiveContext tells the host which context later host calls act on.
	SetEffectiveContext(contextID uint32) error
}

// HTTPCallback is the user's DispatchHttpCall callback.
type HTTPCallback func(numHeaders, bodySize, numTrailers int)

// State is the guest's view of the contexts the host created. It is not safe for
// concurrent use; a wasm guest has a single thread, and re-entrant callbacks are
// handled by saving and restoring the active context instead of locking (a lock held
// across a host call would deadlock the moment the host called back).
type State struct {
	host      Host
	vmContext types.VMContext

	plugins map[uint32]*pluginState
	http    map[uint32]types.HttpContext
	tcp     map[uint32]types.TcpContext
	// rootOf maps every live context to its plugin context (a plugin context to itself),
	// so a callout registered from a stream lands on the right plugin and a response for
	// a deleted stream is recognised.
	rootOf map[uint32]uint32

	// recent is the HTTP context created last: most callbacks are for it (a stream's
	// callbacks follow each other), and map lookups are dear in a Wasm guest.
	recent struct {
		id  uint32
		ctx types.HttpContext
	}

	active uint32
	// inFlight is the stack of proxy_http_call host calls that have not returned yet;
	// see DispatchHTTPCall.
	inFlight []*dispatch
}

type pluginState struct {
	context  types.PluginContext
	callouts map[uint32]callout
}

type callout struct {
	callback HTTPCallback
	caller   uint32
}

type dispatch struct {
	callout
	plugin    uint32
	delivered bool
}

// New returns an empty State that calls host for effective-context changes.
func New(host Host) *State {
	return &State{
		host:    host,
		plugins: map[uint32]*pluginState{},
		http:    map[uint32]types.HttpContext{},
		tcp:     map[uint32]types.TcpContext{},
		rootOf:  map[uint32]uint32{},
	}
}

// SetVMContext installs the filter's VM context.
func (s *State) SetVMContext(vm types.VMContext) { s.vmContext = vm }

// ActiveContextID is the context of the callback being run.
func (s *State) ActiveContextID() uint32 { return s.active }

// Enter makes contextID active and returns the previously active context for Leave.
// Restoring it matters when the host calls back into the guest from inside a host call
// (Envoy may run response callbacks inside proxy_send_local_response, a test host may
// answer proxy_http_call at once): without it, the outer callback would continue with
// the inner callback's context and register its next HTTP call on the wrong stream.
func (s *State) Enter(contextID uint32) (previous uint32) {
	previous = s.active
	s.active = contextID
	return previous
}

// Leave restores the context Enter replaced.
func (s *State) Leave(previous uint32) { s.active = previous }

// OnContextCreate handles proxy_on_context_create: parent 0 creates a plugin context,
// anything else a stream context of that plugin, HTTP if the plugin makes one, else TCP.
func (s *State) OnContextCreate(contextID, pluginContextID uint32) {
	if pluginContextID == 0 {
		s.createPluginContext(contextID)
		return
	}
	if s.createHTTPContext(contextID, pluginContextID) {
		return
	}
	if s.createTCPContext(contextID, pluginContextID) {
		return
	}
	panic(fmt.Sprintf("proxywasm: plugin context %d created neither an HTTP nor a TCP context for %d", pluginContextID, contextID))
}

func (s *State) createPluginContext(contextID uint32) {
	if s.vmContext == nil {
		// The usual cause: SetVMContext called from main, which a reactor never runs.
		panic("proxywasm: no VM context; call proxywasm.SetVMContext from func init()")
	}
	s.plugins[contextID] = &pluginState{
		context:  s.vmContext.NewPluginContext(contextID),
		callouts: map[uint32]callout{},
	}
	// A plugin context is its own root, so HTTP calls dispatched from it (OnTick,
	// OnPluginStart) find their plugin like calls from streams do.
	s.rootOf[contextID] = contextID
}

func (s *State) plugin(pluginContextID uint32) *pluginState {
	p, ok := s.plugins[pluginContextID]
	if !ok {
		panic(fmt.Sprintf("proxywasm: unknown plugin context %d", pluginContextID))
	}
	return p
}

func (s *State) createHTTPContext(contextID, pluginContextID uint32) bool {
	p := s.plugin(pluginContextID)
	if _, ok := s.http[contextID]; ok {
		panic(fmt.Sprintf("proxywasm: HTTP context %d created twice", contextID))
	}
	ctx := p.context.NewHttpContext(contextID)
	if ctx == nil {
		return false
	}
	s.rootOf[contextID] = pluginContextID
	s.http[contextID] = ctx
	s.recent.id, s.recent.ctx = contextID, ctx
	return true
}

// httpContext finds an HTTP context, the recent one without a map lookup.
func (s *State) httpContext(contextID uint32) (types.HttpContext, bool) {
	if s.recent.ctx != nil && s.recent.id == contextID {
		return s.recent.ctx, true
	}
	ctx, ok := s.http[contextID]
	return ctx, ok
}

func (s *State) createTCPContext(contextID, pluginContextID uint32) bool {
	p := s.plugin(pluginContextID)
	if _, ok := s.tcp[contextID]; ok {
		panic(fmt.Sprintf("proxywasm: TCP context %d created twice", contextID))
	}
	ctx := p.context.NewTcpContext(contextID)
	if ctx == nil {
		return false
	}
	s.rootOf[contextID] = pluginContextID
	s.tcp[contextID] = ctx
	return true
}

// OnVMStart handles proxy_on_vm_start. The SDK ignores the plugin context id here and so
// do we: the VM context is per VM.
func (s *State) OnVMStart(vmConfigurationSize int) types.OnVMStartStatus {
	if s.vmContext == nil {
		panic("proxywasm: no VM context; call proxywasm.SetVMContext from func init()")
	}
	return s.vmContext.OnVMStart(vmConfigurationSize)
}

// OnConfigure handles proxy_on_configure.
func (s *State) OnConfigure(pluginContextID uint32, pluginConfigurationSize int) types.OnPluginStartStatus {
	return s.plugin(pluginContextID).context.OnPluginStart(pluginConfigurationSize)
}

// OnTick handles proxy_on_tick.
func (s *State) OnTick(pluginContextID uint32) { s.plugin(pluginContextID).context.OnTick() }

// OnQueueReady handles proxy_on_queue_ready.
func (s *State) OnQueueReady(pluginContextID, queueID uint32) {
	s.plugin(pluginContextID).context.OnQueueReady(queueID)
}

// HTTPContext returns the HTTP context for a stream callback; an unknown id is a host bug.
func (s *State) HTTPContext(contextID uint32) types.HttpContext {
	ctx, ok := s.httpContext(contextID)
	if !ok {
		panic(fmt.Sprintf("proxywasm: unknown HTTP context %d", contextID))
	}
	return ctx
}

// TCPContext returns the TCP context for a stream callback; an unknown id is a host bug.
func (s *State) TCPContext(contextID uint32) types.TcpContext {
	ctx, ok := s.tcp[contextID]
	if !ok {
		panic(fmt.Sprintf("proxywasm: unknown TCP context %d", contextID))
	}
	return ctx
}

// OnLog handles proxy_on_log: the end of a stream (OnStreamDone / OnHttpStreamDone).
// Plugin contexts have nothing to run here.
func (s *State) OnLog(contextID uint32) {
	if ctx, ok := s.httpContext(contextID); ok {
		ctx.OnHttpStreamDone()
	} else if ctx, ok := s.tcp[contextID]; ok {
		ctx.OnStreamDone()
	}
}

// OnDone handles proxy_on_done: a plugin context may ask for time (false) and later call
// PluginDone; stream contexts are always done.
func (s *State) OnDone(contextID uint32) bool {
	if s.recent.ctx != nil && s.recent.id == contextID {
		return true // a stream
	}
	if p, ok := s.plugins[contextID]; ok {
		return p.context.OnPluginDone()
	}
	return true
}

// OnDelete handles proxy_on_delete and forgets the context.
func (s *State) OnDelete(contextID uint32) {
	delete(s.rootOf, contextID)
	if _, ok := s.httpContext(contextID); ok {
		delete(s.http, contextID)
		if s.recent.id == contextID {
			s.recent.id, s.recent.ctx = 0, nil
		}
	} else if _, ok := s.tcp[contextID]; ok {
		delete(s.tcp, contextID)
	} else if _, ok := s.plugins[contextID]; ok {
		delete(s.plugins, contextID)
	} else {
		panic(fmt.Sprintf("proxywasm: proxy_on_delete for unknown context %d", contextID))
	}
}

// ErrNoActiveContext is returned by DispatchHTTPCall outside of any callback: there is
// no plugin to deliver the response to.
var ErrNoActiveContext = errors.New("proxywasm: DispatchHttpCall outside of a callback")

// DispatchHTTPCall registers callback for the HTTP call that call makes (call runs the
// proxy_http_call host call and returns its token).
//
// The callback is attached to the plugin context of the active context, with the active
// context as the caller, as in the SDK. Unlike the SDK it is also reachable while call
// is still running: a host that answers before proxy_http_call returns (an offline test
// host may) gets its response delivered to this callback, because the token is not
// known until call returns.
func (s *State) DispatchHTTPCall(callback HTTPCallback, call func() (token uint32, err error)) (uint32, error) {
	root, ok := s.rootOf[s.active]
	if !ok {
		return 0, ErrNoActiveContext
	}
	d := &dispatch{callout: callout{callback: callback, caller: s.active}, plugin: root}
	s.inFlight = append(s.inFlight, d)
	token, err := call()
	s.inFlight[len(s.inFlight)-1] = nil
	s.inFlight = s.inFlight[:len(s.inFlight)-1]
	if err != nil {
		return 0, err
	}
	if !d.delivered {
		if p, ok := s.plugins[root]; ok { // the plugin may have been deleted meanwhile
			p.callouts[token] = d.callout
		}
	}
	return token, nil
}

// OnHTTPCallResponse handles proxy_on_http_call_response: it finds the callback by token
// on the plugin context, makes the caller the active and effective context, and runs the
// callback, unless the caller was deleted before the response arrived (then the
// callback could act on a stream that no longer exists; the SDK skips it too).
//
// The caller of OnHTTPCallResponse must have entered the plugin context; the callback
// runs with the calling context active instead.
func (s *State) OnHTTPCallResponse(pluginContextID, token uint32, numHeaders, bodySize, numTrailers int) {
	p := s.plugin(pluginContextID)
	c, ok := p.callouts[token]
	if ok {
		delete(p.callouts, token)
	} else if n := len(s.inFlight); n > 0 && s.inFlight[n-1].plugin == pluginContextID && !s.inFlight[n-1].delivered {
		// Answered from inside proxy_http_call: this is the call being made.
		s.inFlight[n-1].delivered = true
		c = s.inFlight[n-1].callout
	} else {
		panic(fmt.Sprintf("proxywasm: HTTP call response for unknown token %d on plugin context %d", token, pluginContextID))
	}
	s.active = c.caller
	if _, alive := s.rootOf[c.caller]; !alive {
		return
	}
	// The status is ignored as in the SDK: the host knows the context, it created it.
	_ = s.host.SetEffectiveContext(c.caller)
	c.callback(numHeaders, bodySize, numTrailers)
}

// PendingHTTPCalls reports the HTTP calls awaiting a response on a plugin context.
func (s *State) PendingHTTPCalls(pluginContextID uint32) int {
	if p, ok := s.plugins[pluginContextID]; ok {
		return len(p.callouts)
	}
	return 0
}
