package vmstate

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// recordingHost records effective-context changes.
type recordingHost struct{ effective []uint32 }

func (h *recordingHost) SetEffectiveContext(id uint32) error {
	h.effective = append(h.effective, id)
	return nil
}

// events records which user callbacks ran, on which context.
type events []string

type vm struct {
	types.DefaultVMContext
	ev       *events
	noHTTP   bool
	plugins  map[uint32]*plugin
	vmStarts int
}

func (v *vm) OnVMStart(int) types.OnVMStartStatus { v.vmStarts++; return types.OnVMStartStatusOK }

func (v *vm) NewPluginContext(id uint32) types.PluginContext {
	p := &plugin{id: id, vm: v, done: true}
	if v.plugins == nil {
		v.plugins = map[uint32]*plugin{}
	}
	v.plugins[id] = p
	return p
}

type plugin struct {
	types.DefaultPluginContext
	id   uint32
	vm   *vm
	done bool
}

func (p *plugin) record(e string)                                  { *p.vm.ev = append(*p.vm.ev, e) }
func (p *plugin) OnPluginStart(size int) types.OnPluginStartStatus { return size < 100 }
func (p *plugin) OnTick()                                          { p.record("tick") }
func (p *plugin) OnQueueReady(q uint32)                            { p.record("queue") }
func (p *plugin) OnPluginDone() bool                               { return p.done }

func (p *plugin) NewHttpContext(id uint32) types.HttpContext {
	if p.vm.noHTTP {
		return nil
	}
	return &stream{id: id, plugin: p}
}

func (p *plugin) NewTcpContext(id uint32) types.TcpContext { return &stream{id: id, plugin: p} }

// stream is both an HTTP and a TCP context.
type stream struct {
	types.DefaultHttpContext
	types.DefaultTcpContext
	id     uint32
	plugin *plugin
}

func (s *stream) OnHttpStreamDone() { s.plugin.record("http done") }
func (s *stream) OnStreamDone()     { s.plugin.record("tcp done") }

func newState(t *testing.T) (*State, *recordingHost, *vm, *events) {
	t.Helper()
	ev := &events{}
	h := &recordingHost{}
	v := &vm{ev: ev}
	s := New(h)
	s.SetVMContext(v)
	return s, h, v, ev
}

func TestLifecycle(t *testing.T) {
	s, _, v, ev := newState(t)

	s.OnContextCreate(1, 0)
	assert.EqualValues(t, true, s.OnVMStart(0))
	assert.Equal(t, 1, v.vmStarts)
	assert.EqualValues(t, true, s.OnConfigure(1, 10))
	assert.EqualValues(t, false, s.OnConfigure(1, 100), "the plugin's status is returned")

	s.OnContextCreate(2, 1)
	_, isHTTP := s.HTTPContext(2).(*stream)
	assert.True(t, isHTTP)
	s.OnLog(2)
	assert.True(t, s.OnDone(2), "stream contexts are always done")
	s.OnDelete(2)
	assert.Panics(t, func() { s.HTTPContext(2) }, "deleted")

	s.OnTick(1)
	s.OnQueueReady(1, 7)
	assert.Equal(t, events{"http done", "tick", "queue"}, *ev)

	v.plugins[1].done = false
	assert.False(t, s.OnDone(1), "a plugin may ask for time")
	s.OnDelete(1)
	assert.Panics(t, func() { s.OnTick(1) })
}

// Streams whose callbacks interleave each get their own context, whichever was created
// last (the one looked up without the map).
func TestInterleavedStreams(t *testing.T) {
	s, _, _, _ := newState(t)
	s.OnContextCreate(1, 0)
	s.OnContextCreate(2, 1)
	s.OnContextCreate(3, 1)
	for _, id := range []uint32{2, 3, 2, 3} {
		assert.Equal(t, id, s.HTTPContext(id).(*stream).id)
	}
	s.OnDelete(3) // the most recent one
	assert.Panics(t, func() { s.HTTPContext(3) })
	assert.Equal(t, uint32(2), s.HTTPContext(2).(*stream).id)
	s.OnContextCreate(4, 1)
	s.OnDelete(2) // not the most recent one
	assert.Panics(t, func() { s.HTTPContext(2) })
	assert.Equal(t, uint32(4), s.HTTPContext(4).(*stream).id)
	assert.True(t, s.OnDone(4))
}

func TestTCPContextWhenPluginMakesNoHTTPContext(t *testing.T) {
	s, _, v, ev := newState(t)
	v.noHTTP = true
	s.OnContextCreate(1, 0)
	s.OnContextCreate(2, 1)
	assert.NotNil(t, s.TCPContext(2))
	assert.Panics(t, func() { s.HTTPContext(2) })
	s.OnLog(2)
	assert.Equal(t, events{"tcp done"}, *ev)
	s.OnDelete(2)
	assert.Panics(t, func() { s.TCPContext(2) })
}

func TestHostBugsPanicWithContext(t *testing.T) {
	s, _, _, _ := newState(t)
	assert.PanicsWithValue(t, "proxywasm: unknown plugin context 9", func() { s.OnContextCreate(2, 9) })
	assert.PanicsWithValue(t, "proxywasm: proxy_on_delete for unknown context 5", func() { s.OnDelete(5) })
	s.OnContextCreate(1, 0)
	s.OnContextCreate(2, 1)
	assert.Panics(t, func() { s.OnContextCreate(2, 1) }, "duplicate stream id")
}

func TestMissingVMContextSaysWhereToRegister(t *testing.T) {
	s := New(&recordingHost{})
	assert.PanicsWithValue(t, "proxywasm: no VM context; call proxywasm.SetVMContext from func init()",
		func() { s.OnContextCreate(1, 0) })
}

func TestEnterLeaveRestoresOuterContext(t *testing.T) {
	s, _, _, _ := newState(t)
	outer := s.Enter(5)
	inner := s.Enter(6) // a callback the host runs from inside a host call of context 5
	assert.Equal(t, uint32(6), s.ActiveContextID())
	s.Leave(inner)
	assert.Equal(t, uint32(5), s.ActiveContextID())
	s.Leave(outer)
	assert.Equal(t, uint32(0), s.ActiveContextID())
}

type response struct {
	on                               uint32
	headers, body, trailers, handled int
}

func TestHTTPCallResponseGoesToTheCaller(t *testing.T) {
	s, h, _, _ := newState(t)
	s.OnContextCreate(1, 0)
	s.OnContextCreate(2, 1)
	s.OnContextCreate(3, 1)

	var got []response
	dispatchFrom := func(ctx, token uint32) {
		prev := s.Enter(ctx)
		defer s.Leave(prev)
		id, err := s.DispatchHTTPCall(func(nh, bs, nt int) {
			got = append(got, response{on: s.ActiveContextID(), headers: nh, body: bs, trailers: nt})
		}, func() (uint32, error) { return token, nil })
		require.NoError(t, err)
		assert.Equal(t, token, id)
	}
	dispatchFrom(2, 10)
	dispatchFrom(3, 11)
	dispatchFrom(1, 12) // from the plugin context itself, e.g. OnTick
	assert.Equal(t, 3, s.PendingHTTPCalls(1))

	respond := func(token uint32, nh int) {
		prev := s.Enter(1)
		defer s.Leave(prev)
		s.OnHTTPCallResponse(1, token, nh, 4, 0)
	}
	respond(11, 1)
	respond(10, 2)
	respond(12, 3)
	assert.Equal(t, []response{{on: 3, headers: 1, body: 4}, {on: 2, headers: 2, body: 4}, {on: 1, headers: 3, body: 4}}, got)
	assert.Equal(t, []uint32{3, 2, 1}, h.effective, "the caller becomes the effective context")
	assert.Equal(t, 0, s.PendingHTTPCalls(1))
	assert.Panics(t, func() { respond(10, 1) }, "a token is answered once")
}

func TestHTTPCallResponseForDeletedCallerIsDropped(t *testing.T) {
	s, h, _, _ := newState(t)
	s.OnContextCreate(1, 0)
	s.OnContextCreate(2, 1)
	prev := s.Enter(2)
	called := false
	_, err := s.DispatchHTTPCall(func(int, int, int) { called = true }, func() (uint32, error) { return 7, nil })
	require.NoError(t, err)
	s.Leave(prev)

	s.OnDelete(2) // the stream timed out before the response
	s.OnHTTPCallResponse(1, 7, 1, 0, 0)
	assert.False(t, called)
	assert.Empty(t, h.effective)
	assert.Equal(t, 0, s.PendingHTTPCalls(1))
}

func TestHTTPCallAnsweredBeforeTheHostCallReturns(t *testing.T) {
	s, _, _, _ := newState(t)
	s.OnContextCreate(1, 0)
	s.OnContextCreate(2, 1)
	prev := s.Enter(2)
	var on []uint32
	token, err := s.DispatchHTTPCall(func(int, int, int) { on = append(on, s.ActiveContextID()) },
		func() (uint32, error) {
			// A host answering at once, from inside proxy_http_call.
			p := s.Enter(1)
			s.OnHTTPCallResponse(1, 99, 1, 0, 0)
			s.Leave(p)
			assert.Equal(t, uint32(2), s.ActiveContextID(), "the dispatching callback continues on its context")
			return 99, nil
		})
	s.Leave(prev)
	require.NoError(t, err)
	assert.Equal(t, uint32(99), token)
	assert.Equal(t, []uint32{2}, on)
	assert.Equal(t, 0, s.PendingHTTPCalls(1), "an answered call is not left registered")
}

func TestFailedDispatchRegistersNothing(t *testing.T) {
	s, _, _, _ := newState(t)
	s.OnContextCreate(1, 0)
	prev := s.Enter(1)
	defer s.Leave(prev)
	hostErr := errors.New("bad cluster")
	_, err := s.DispatchHTTPCall(func(int, int, int) {}, func() (uint32, error) { return 0, hostErr })
	assert.ErrorIs(t, err, hostErr)
	assert.Equal(t, 0, s.PendingHTTPCalls(1))
}

func TestDispatchOutsideACallback(t *testing.T) {
	s, _, _, _ := newState(t)
	called := false
	_, err := s.DispatchHTTPCall(func(int, int, int) {}, func() (uint32, error) { called = true; return 1, nil })
	assert.ErrorIs(t, err, ErrNoActiveContext)
	assert.False(t, called, "the host is not asked to make a call nobody can receive")
}
