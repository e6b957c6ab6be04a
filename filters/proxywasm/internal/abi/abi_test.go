package abi

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func TestEncodePairsMatchesSpecExample(t *testing.T) {
	// The spec's example {{"a": "1"}, {"b": "22"}} with u32 little-endian integers.
	want := []byte{
		2, 0, 0, 0,
		1, 0, 0, 0, 1, 0, 0, 0,
		1, 0, 0, 0, 2, 0, 0, 0,
		'a', 0, '1', 0, 'b', 0, '2', '2', 0,
	}
	assert.Equal(t, want, EncodePairs([][2]string{{"a", "1"}, {"b", "22"}}))
}

func TestPairsRoundTrip(t *testing.T) {
	for name, pairs := range map[string][][2]string{
		"empty":        {},
		"one":          {{":path", "/admin"}},
		"empty values": {{"x-empty", ""}, {"", "no-key"}},
		"repeated":     {{"set-cookie", "a=1"}, {"set-cookie", "b=2"}, {":status", "200"}},
		"binary-ish":   {{"k", "v\xffv"}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodePairs(EncodePairs(pairs))
			require.NoError(t, err)
			assert.Equal(t, len(pairs), len(got))
			for i := range pairs {
				assert.Equal(t, pairs[i], got[i])
			}
		})
	}
}

func TestDecodePairsEmptyForms(t *testing.T) {
	// The spec allows an empty map as no bytes or as one NUL byte.
	for _, b := range [][]byte{nil, {}, {0}} {
		got, err := DecodePairs(b)
		require.NoError(t, err)
		assert.Empty(t, got)
	}
}

func TestDecodePairsRejectsMalformed(t *testing.T) {
	good := EncodePairs([][2]string{{"key", "value"}})
	for name, b := range map[string][]byte{
		"truncated data":   good[:len(good)-3],
		"huge count":       {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0},
		"length past end":  {1, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 'a', 0, 0},
		"lengths only":     good[:12],
		"count, no pairs":  {1, 0, 0, 0},
		"value runs short": {1, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 'a', 0, 'b', 0},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodePairs(b)
			assert.ErrorIs(t, err, ErrMalformedPairs)
		})
	}
}

func TestEncodePath(t *testing.T) {
	assert.Equal(t, []byte("cluster_metadata\x00filter_metadata\x00foo"),
		EncodePath([]string{"cluster_metadata", "filter_metadata", "foo"}))
	assert.Equal(t, []byte("request"), EncodePath([]string{"request"}))
	assert.Empty(t, EncodePath(nil))
}

func TestStatusError(t *testing.T) {
	for status, want := range map[uint32]error{
		StatusOK:              nil,
		StatusNotFound:        types.ErrorStatusNotFound,
		StatusBadArgument:     types.ErrorStatusBadArgument,
		StatusEmpty:           types.ErrorStatusEmpty,
		StatusCasMismatch:     types.ErrorStatusCasMismatch,
		StatusInternalFailure: types.ErrorInternalFailure,
		StatusUnimplemented:   types.ErrorUnimplemented,
	} {
		assert.Equal(t, want, StatusError(status), "status %d", status)
	}
	for _, status := range []uint32{StatusSerializationFailure, StatusParseFailure, StatusInvalidMemoryAccess, 99} {
		err := StatusError(status)
		require.Error(t, err)
		for _, sentinel := range []error{types.ErrorStatusNotFound, types.ErrorStatusBadArgument, types.ErrorInternalFailure} {
			assert.False(t, errors.Is(err, sentinel), "status %d", status)
		}
	}
	assert.Contains(t, StatusError(99).Error(), "99")
}
