package protowire

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVarintsRoundTripAsTheStandardLibraryWritesThem(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 300, 1<<14 - 1, 1 << 14, 1<<35 + 7, math.MaxUint64} {
		b := AppendVarint([]byte{0xAA}, v)
		assert.Equal(t, binary.AppendUvarint([]byte{0xAA}, v), b, "%d", v)
		assert.Equal(t, len(b)-1, VarintSize(v), "%d", v)
		got, rest, err := ReadVarint(append(b[1:], 0x55))
		require.NoError(t, err)
		assert.Equal(t, v, got)
		assert.Equal(t, []byte{0x55}, rest, "what follows the varint is left")
	}
	_, _, err := ReadVarint([]byte{0x80, 0x80})
	assert.ErrorIs(t, err, ErrTruncated)
	ten := []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80}
	_, _, err = ReadVarint(ten)
	assert.EqualError(t, err, "varint overflows 64 bits", "ten bytes that all go on are more than a uint64 holds")
	_, _, err = ReadVarint(append(ten, 0x01))
	assert.EqualError(t, err, "varint overflows 64 bits")
}

// A message with a field of every wire type the filters meet: Each hands each one over in
// order, with the varint's value and the bytes' payload, and skips the fixed-size ones'.
func TestEachReadsEveryField(t *testing.T) {
	var msg []byte
	msg = AppendString(msg, 1, "name")
	msg = AppendVarint(AppendTag(msg, 2, Varint), 300)
	msg = append(AppendTag(msg, 3, Fixed64), 1, 2, 3, 4, 5, 6, 7, 8)
	msg = append(AppendTag(msg, 4, Fixed32), 1, 2, 3, 4)
	msg = AppendBytes(msg, maxFieldNumber, []byte{9, 9})

	var got []Field
	require.NoError(t, Each(msg, func(f Field) error { got = append(got, f); return nil }))
	assert.Equal(t, []Field{
		{Num: 1, Wire: Bytes, Bytes: []byte("name")},
		{Num: 2, Wire: Varint, Value: 300},
		{Num: 3, Wire: Fixed64},
		{Num: 4, Wire: Fixed32},
		{Num: maxFieldNumber, Wire: Bytes, Bytes: []byte{9, 9}},
	}, got)

	// Cut anywhere inside a field, the message is truncated.
	for cut := 1; cut < len(msg); cut++ {
		err := Each(msg[:cut], func(Field) error { return nil })
		if cut == 6 || cut == 9 || cut == 18 || cut == 23 {
			assert.NoError(t, err, "a cut between fields at %d", cut)
			continue
		}
		assert.ErrorIs(t, err, ErrTruncated, "cut at %d", cut)
	}
}

func TestEachRefusesWhatIsNotAField(t *testing.T) {
	noop := func(Field) error { return nil }
	assert.EqualError(t, Each(AppendTag(nil, 0, Varint), noop), "bad field number 0")
	assert.EqualError(t, Each(AppendTag(nil, maxFieldNumber+1, Varint), noop), "bad field number 536870912")
	assert.EqualError(t, Each(append(AppendTag(nil, 7, 3), 0), noop), "field 7: unsupported wire type 3")
}
