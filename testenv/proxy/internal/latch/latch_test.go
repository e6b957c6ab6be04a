package latch

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCallbacksRunOnceWhenSet(t *testing.T) {
	var l Latch
	var got []int
	l.OnSet(func() { got = append(got, 1) })
	l.OnSet(func() { got = append(got, 2) })
	assert.False(t, l.IsSet())
	assert.Empty(t, got, "nothing runs before the latch is set")
	l.Set()
	assert.True(t, l.IsSet())
	assert.Equal(t, []int{1, 2}, got, "in the order registered")
	l.Set()
	assert.Equal(t, []int{1, 2}, got, "setting again runs nothing again")
	l.OnSet(func() { got = append(got, 3) })
	assert.Equal(t, []int{1, 2, 3}, got, "registered after: at once")
}
