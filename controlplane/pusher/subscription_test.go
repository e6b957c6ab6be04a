package pusher

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// Proxies naming the same set, in any order and with repeats, hold one subscription; the
// last to let go forgets it, so a mesh whose proxies come and go keeps no set of those gone.
func TestSubscriptionsAreSharedAndForgotten(t *testing.T) {
	ss := newSubscriptions()
	a := ss.acquire([]string{"y", "x"})
	b := ss.acquire([]string{"x", "y", "x"})
	require.Same(t, a, b)
	assert.Equal(t, []string{"x", "y"}, a.names)
	assert.True(t, a.SameAs([]string{"y", "x"}))
	assert.False(t, a.SameAs([]string{"x"}))
	c := ss.acquire([]string{"x"})
	assert.NotSame(t, a, c)

	ss.release(a)
	assert.Same(t, b, ss.acquire([]string{"x", "y"}), "still held: shared again")
	ss.release(b)
	ss.release(b)
	ss.release(c)
	assert.Empty(t, ss.m, "every set is forgotten once nobody holds it")
}

// A delta request's change of names leads to the subscription of the resulting set: the one
// a proxy naming that set outright holds. Adding what is there or removing what is not
// changes nothing, and the subscription left is released.
func TestDeltaChangesLeadToTheSharedSet(t *testing.T) {
	cases := []struct {
		name        string
		from        []string // nil: no subscription yet
		add, remove []string
		want        []string
	}{
		{name: "add", from: []string{"a", "b"}, add: []string{"c"}, want: []string{"a", "b", "c"}},
		{name: "remove", from: []string{"a", "b"}, remove: []string{"a"}, want: []string{"b"}},
		{name: "add and remove", from: []string{"a", "b"}, add: []string{"c"}, remove: []string{"a"}, want: []string{"b", "c"}},
		{name: "remove all", from: []string{"a", "b"}, remove: []string{"b", "a"}, want: []string{}},
		{name: "add what is there", from: []string{"a", "b"}, add: []string{"a"}, want: []string{"a", "b"}},
		{name: "remove what is not there", from: []string{"a"}, remove: []string{"z"}, want: []string{"a"}},
		{name: "nothing", from: []string{"a"}, want: []string{"a"}},
		{name: "first names", add: []string{"b", "a"}, want: []string{"a", "b"}},
		{name: "first request naming nothing", want: []string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ss := newSubscriptions()
			held := ss.acquire(tc.want) // another proxy's, naming the result outright
			var from *Subscription
			if tc.from != nil {
				from = ss.acquire(tc.from)
			}
			to := ss.change(from, tc.add, tc.remove)
			require.NotNil(t, to)
			assert.Equal(t, tc.want, to.names)
			assert.Same(t, held, to)
			ss.release(to)
			ss.release(held)
			assert.Empty(t, ss.m, "the set left and the set reached are released")
		})
	}
}

// Proxies making the same change from the same set share its result, also when it was
// remembered from an earlier change; a change remembered from a set nobody holds any more is
// not reused, and changes that spell the same when their names are run together are not
// mistaken for each other.
func TestRepeatedDeltaChangesShareTheirResult(t *testing.T) {
	ss := newSubscriptions()
	p1, p2, p3 := ss.acquire([]string{"a"}), ss.acquire([]string{"a"}), ss.acquire([]string{"a"})
	to1 := ss.change(p1, []string{"b"}, nil)
	to2 := ss.change(p2, []string{"b"}, nil)
	require.Same(t, to1, to2)
	ss.release(to1) // the first proxy leaves
	joiner := ss.acquire([]string{"a", "b"})
	assert.Same(t, to2, joiner, "the second still holds it: shared with a newcomer")

	ss.release(to2)
	ss.release(joiner) // nobody holds {a, b}: forgotten
	to3 := ss.change(p3, []string{"b"}, nil)
	assert.Equal(t, []string{"a", "b"}, to3.names)
	assert.Same(t, to3, ss.acquire([]string{"a", "b"}), "a forgotten result is not reused")
	ss.release(to3)
	ss.release(to3)
	assert.Empty(t, ss.m)

	from := ss.acquire([]string{"x"})
	ss.acquire([]string{"x"})
	joined := ss.change(from, []string{"p-q"}, nil)
	apart := ss.change(from, []string{"p"}, []string{"q"})
	assert.Equal(t, []string{"p-q", "x"}, joined.names)
	assert.Equal(t, []string{"p", "x"}, apart.names)
}

// A delta watch that names nothing gets nothing (not every resource of the type), and a
// proxy's changes of a type it watches whole, or after it closed, change nothing.
func TestProxyWatchesFollowTheirChanges(t *testing.T) {
	p := &Pusher{subs: newSubscriptions(), index: newWatchIndex()}
	w := p.Watch(&model.Proxy{}, nil)
	const eds, cds = "eds", "cds"
	w.Change(eds, nil, nil)
	assert.NotNil(t, w.Names(eds), "a named watch of nothing")
	assert.Equal(t, 0, w.Subscribed(eds))
	w.Change(eds, []string{"a", "b"}, nil)
	assert.True(t, w.Watches(eds, "a"))
	assert.True(t, w.SameNames(eds, []string{"b", "a"}))
	w.Change(eds, nil, []string{"a"})
	assert.False(t, w.Watches(eds, "a"))
	assert.Equal(t, 1, w.Subscribed(eds))

	w.Subscribe(cds, true, nil)
	w.Change(cds, []string{"x"}, nil)
	assert.True(t, w.Watches(cds, "anything"))
	assert.Nil(t, w.Names(cds), "a wildcard watch names nothing")

	w.Close()
	w.Change(eds, []string{"c"}, nil)
	w.Subscribe(eds, false, []string{"d"})
	assert.False(t, w.Watches(eds, "c"))
	assert.False(t, w.Watches(eds, "d"))
	assert.Empty(t, p.subs.m, "a closed proxy holds no subscription")
}

// The changes remembered from a set are a bounded cache: different changes from one set are
// remembered side by side (a proxy repeating any of them reuses its result), and past 64 of
// them the memory starts over instead of growing with every change ever made.
func TestRememberedChangesAreBounded(t *testing.T) {
	ss := newSubscriptions()
	from := ss.acquire([]string{"a"})
	ss.acquire([]string{"a"}) // held elsewhere too, so each change leaves it in place
	for i := range 200 {
		to := ss.change(from, []string{fmt.Sprint("n", i)}, nil)
		require.Equal(t, []string{"a", fmt.Sprint("n", i)}, to.names)
		ss.acquire([]string{"a"})
		if i > 0 && i < 64 {
			require.Len(t, from.next, i+1, "every change so far is remembered")
		}
		require.LessOrEqual(t, len(from.next), 65)
	}
}
