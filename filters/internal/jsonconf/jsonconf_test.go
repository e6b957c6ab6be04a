package jsonconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type bucket struct {
	Max      *int64 `json:"max_tokens"`
	Interval string `json:"fill_interval"`
}

type entry struct {
	Key      string   `json:"key"`
	Prefixes []string `json:"prefixes"`
}

// fields are what encoding/json and jsonconf both decode.
type fields struct {
	Name    string            `json:"name"`
	Shadow  bool              `json:"shadow"`
	Weight  float64           `json:"weight"`
	Port    uint16            `json:"port"`
	Small   int8              `json:"small"`
	Bucket  *bucket           `json:"token_bucket"`
	Entries []entry           `json:"entries"`
	Match   map[string]string `json:"match"`
}

type conf struct {
	fields        // embedded: its fields are conf's
	Later     Raw `json:"later"`
	Untagged  string
	Skipped   string `json:"-"`
	Interface any    `json:"any"`
}

func TestUnmarshalFillsEveryKind(t *testing.T) {
	var c conf
	require.NoError(t, Unmarshal([]byte(` {
		"name": "per_user", "shadow": true, "weight": -1.5e2, "port": 65535, "small": -128,
		"token_bucket": {"max_tokens": 9007199254740993, "fill_interval": "1s"},
		"entries": [{"key": "u", "prefixes": ["/a", "/b"]}, {"key": "m", "prefixes": null}],
		"match": {"u": "alice", "m": "GET"},
		"later": {"x": [1, true, null]}
	} `), &c))
	max := int64(9007199254740993) // beyond float64's exact integers: read as an integer
	assert.Equal(t, conf{fields: fields{
		Name: "per_user", Shadow: true, Weight: -150, Port: 65535, Small: -128,
		Bucket:  &bucket{Max: &max, Interval: "1s"},
		Entries: []entry{{Key: "u", Prefixes: []string{"/a", "/b"}}, {Key: "m"}},
		Match:   map[string]string{"u": "alice", "m": "GET"},
	}, Later: Raw(`{"x": [1, true, null]}`)}, c)
}

func TestNullAsEncodingJSONHasIt(t *testing.T) {
	max := int64(3)
	c := conf{fields: fields{Name: "kept", Shadow: true, Bucket: &bucket{Max: &max}, Entries: []entry{{}}, Match: map[string]string{"a": "b"}}, Later: Raw("1")}
	require.NoError(t, Unmarshal([]byte(`{"name": null, "shadow": null, "token_bucket": null, "entries": null, "match": null, "later": null}`), &c))
	assert.Equal(t, conf{fields: fields{Name: "kept", Shadow: true}}, c)
}

func TestStringsAsEncodingJSONHasThem(t *testing.T) {
	for _, in := range []string{
		`"plain"`, `""`, `"\"\\\/\b\f\n\r\t"`, `"\u00e9\u4e2d"`, `"é中"`,
		`"\ud83d\ude00"`,                                      // a surrogate pair: one character
		`"\ud83d"`, `"\ud83dx"`, `"\ude00"`, `"\ud83d\u0041"`, // lone or broken surrogates: U+FFFD
		"\"\xff\xfe\"", "\"a\xc3\"", "\"\x80\"", "\"\\n\x80\"", // invalid UTF-8: U+FFFD
		"\"\x7f \\n \x7f\"", `"\u00E9\u00e9"`, `"\u0009\u90aF\uAfA0"`,
	} {
		var got, want string
		require.NoError(t, json.Unmarshal([]byte(in), &want), in)
		require.NoError(t, Unmarshal([]byte(in), &got), in)
		assert.Equal(t, want, got, in)
	}
}

// A document cut anywhere is an error, whatever was being read there.
func TestEveryCutIsAnError(t *testing.T) {
	doc := `{"name": "a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00\ud83d\u0041 é", "shadow": false, "weight": -0.5e+3,
		"port": 0, "small": 10, "token_bucket": {}, "entries": [{}, {"key": "k", "prefixes": []}],
		"match": {"a": ""}, "later": [{"x": [[], {}, null, true, 1E-2, "\ud83d\"\u0041"]}, 0]}`
	var whole conf
	require.NoError(t, Unmarshal([]byte(doc), &whole))
	var raw Raw
	require.NoError(t, Unmarshal([]byte(doc), &raw))
	for i := range len(doc) {
		var c conf
		assert.Error(t, Unmarshal([]byte(doc[:i]), &c), "cut at %d: %q", i, doc[:i])
		assert.Error(t, Unmarshal([]byte(doc[:i]), &raw), "cut at %d, as Raw: %q", i, doc[:i])
	}
}

// Nesting is bounded by depth, not by how many values a level holds.
func TestDepthCountsNestingOnly(t *testing.T) {
	var raw Raw
	wide := "[" + strings.Repeat("[[]],", 2*maxDepth) + "[]]"
	require.NoError(t, Unmarshal([]byte(wide), &raw))
	deep := strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth)
	require.NoError(t, Unmarshal([]byte(deep), &raw))
	require.EqualError(t, Unmarshal([]byte("["+deep+"]"), &raw), "nesting deeper than 1000 at offset 1000")
}

func TestErrorsSayWhatAndWhere(t *testing.T) {
	for in, want := range map[string]string{
		``:                                   "unexpected end of JSON input",
		`   `:                                "unexpected end of JSON input",
		`not json`:                           `invalid character 'o' at offset 1 in literal null`,
		`{"name": "a"} {}`:                   "unexpected data after the JSON value at offset 14",
		`{"name": "a",}`:                     `invalid character '}' at offset 13 looking for the start of an object key`,
		`{"name" "a"}`:                       `invalid character '"' at offset 8 after an object key`,
		`{"name": "a" "shadow": true}`:       `invalid character '"' at offset 13 after an item of "{}"`,
		`{"name": "a`:                        "unexpected end of JSON input",
		"{\"name\": \"a\nb\"}":               "invalid character '\\n' at offset 11 in a string (control characters must be escaped)",
		`{"name": "\x"}`:                     `invalid character 'x' at offset 11 in a string escape`,
		`{"name": "\u12g4"}`:                 `invalid character 'g' at offset 14 in a \u escape`,
		`{"name": "\u12G4"}`:                 `invalid character 'G' at offset 14 in a \u escape`,
		`{"name": "\u12/4"}`:                 `invalid character '/' at offset 14 in a \u escape`,
		`{"name": "\u12:4"}`:                 `invalid character ':' at offset 14 in a \u escape`,
		`{"name": "\u12@4"}`:                 `invalid character '@' at offset 14 in a \u escape`,
		"{\"name\": \"\\u12`4\"}":            "invalid character '`' at offset 14 in a \\u escape",
		"{\"name\": \"\x1fa\"}":              `invalid character '\x1f' at offset 10 in a string (control characters must be escaped)`,
		"{\"name\": \"\\n\x1f\"}":            `invalid character '\x1f' at offset 12 in a string (control characters must be escaped)`,
		`{"weight": 01}`:                     `invalid character '1' at offset 12 after an item of "{}"`,
		`{"weight": 1.}`:                     `invalid character '}' at offset 13 after a decimal point`,
		`{"weight": 1e}`:                     `invalid character '}' at offset 13 in an exponent`,
		`{"weight": -}`:                      `invalid character '}' at offset 12 looking for the start of a value`,
		`{"shadow": tru}`:                    `invalid character '}' at offset 14 in literal true`,
		`{"names": "a"}`:                     "names: unknown field",
		`{"Name": "a"}`:                      "Name: unknown field",
		`{"Untagged": "a"}`:                  "Untagged: unknown field",
		`{"-": "a"}`:                         "-: unknown field",
		`{"fields": {}}`:                     "fields: unknown field",
		`{"token_bucket": {"max_token": 1}}`: "token_bucket.max_token: unknown field",
		`{"entries": [{"key": "u"}, {"kye": 1}]}`: "entries[1].kye: unknown field",
		`{"name": 1}`:                           "name: want a string, not a number",
		`{"shadow": "yes"}`:                     "shadow: want a boolean, not a string",
		`{"token_bucket": []}`:                  "token_bucket: want an object, not an array",
		`{"entries": {}}`:                       "entries: want an array, not an object",
		`{"entries": [{"prefixes": [1]}]}`:      "entries[0].prefixes[0]: want a string, not a number",
		`{"match": {"u": true}}`:                "match.u: want a string, not a boolean",
		`{"small": 128}`:                        "small: number 128 is not a whole number that fits int8",
		`{"port": -1}`:                          "port: number -1 is not a whole number that fits uint16",
		`{"token_bucket": {"max_tokens": 1.5}}`: "token_bucket.max_tokens: number 1.5 is not a whole number that fits int64",
		`{"weight": 1e999}`:                     "weight: number 1e999 does not fit float64",
		`{"any": 1}`:                            "any: cannot decode into interface {}",
		`{"names": {"a": [1, }}`:                `invalid character '}' at offset 20 looking for the start of a value`,
		`{"name": "a"`:                          "unexpected end of JSON input",
		`[]`:                                    "want an object, not an array",
		`[`:                                     "unexpected end of JSON input",
		`"x"`:                                   "want an object, not a string",
		strings.Repeat(`{"later":`, 2):          "unexpected end of JSON input",
		`{"later": ` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`: "nesting deeper than 1000 at offset 1009",
	} {
		var c conf
		err := Unmarshal([]byte(in), &c)
		if assert.Error(t, err, in) {
			assert.Equal(t, want, err.Error(), in)
		}
	}
	assert.EqualError(t, Unmarshal([]byte(`{}`), conf{}), "jsonconf: Unmarshal needs a non-nil pointer")
}

// The package reads JSON as encoding/json does: the same documents are valid, and a
// document that decodes here decodes there to the same value (and to the same with Proto).
func FuzzUnmarshalAgreesWithEncodingJSON(f *testing.F) {
	for _, seed := range []string{
		`{"name": "a", "shadow": true, "weight": 1.5, "port": 80, "small": 1}`,
		`{"token_bucket": {"max_tokens": 10, "fill_interval": "1s"}, "entries": [{"key": "k", "prefixes": ["/"]}]}`,
		`{"match": {"a": "\u00e9\ud83d\ude00"}, "later": [1, {"x": null}, "s", -0.5e-3, false]}`,
		`{"name": "a"} x`, `[1, 2,]`, `"\ud800"`, `01`, `-`, `{"a" 1}`, "\"\xff\"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var raw Raw
		rawErr := Unmarshal(data, &raw)
		if valid := json.Valid(data); valid != (rawErr == nil) {
			t.Fatalf("encoding/json says valid=%v, jsonconf says %v", valid, rawErr)
		}
		if rawErr == nil && !bytes.Equal(bytes.TrimSpace(data), raw) {
			t.Fatalf("Raw %q is not the document %q", raw, data)
		}
		var got fields
		err := Unmarshal(data, &got)
		var want fields
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		jsonErr := dec.Decode(&want)
		if jsonErr == nil {
			if _, tail := dec.Token(); !errors.Is(tail, io.EOF) {
				jsonErr = errors.New("trailing data")
			}
		}
		switch {
		case err == nil && jsonErr != nil:
			t.Fatalf("jsonconf decoded what encoding/json refuses (%v): %+v", jsonErr, got)
		case err == nil:
			assert.Equal(t, want, got)
			var proto fields // Proto only widens what is accepted
			require.NoError(t, Options{Proto: true}.Unmarshal(data, &proto))
			assert.Equal(t, got, proto)
		case jsonErr == nil && !strings.Contains(err.Error(), "unknown field"):
			// The one difference allowed: encoding/json matches names case-insensitively.
			t.Fatalf("jsonconf refused (%v) what encoding/json decodes: %+v", err, want)
		}
	})
}

// With Proto, a document reads as protobuf's C++ JSON parser reads it into a message.
func TestProtoReadsAsProtobufDoes(t *testing.T) {
	proto := Options{Proto: true}
	var c conf
	require.NoError(t, proto.Unmarshal([]byte(`{"name": "a", "tokenBucket": {"maxTokens": "-5", "fill_interval": "1s"},
		"shadow": "true", "port": "8080", "small": 3, "entries": [{"key": "k"}]}`), &c))
	max := int64(-5)
	assert.Equal(t, conf{fields: fields{Name: "a", Shadow: true, Port: 8080, Small: 3,
		Bucket: &bucket{Max: &max, Interval: "1s"}, Entries: []entry{{Key: "k"}}}}, c)
	require.NoError(t, proto.Unmarshal([]byte(`{"shadow": "false"}`), &c))
	assert.False(t, c.Shadow)

	for in, want := range map[string]string{
		`{"shadow": "no"}`:                         `shadow: want a boolean, not the string "no"`,
		`{"shadow": "True"}`:                       `shadow: want a boolean, not the string "True"`,
		`{"port": "80x"}`:                          "port: number 80x is not a whole number that fits uint16",
		`{"port": "70000"}`:                        "port: number 70000 is not a whole number that fits uint16",
		`{"weight": "1.5"}`:                        "weight: want a number, not a string",
		`{"name": 5}`:                              "name: want a string, not a number",
		`{"Name": "a"}`:                            "Name: unknown field",
		`{"token_Bucket": {}}`:                     "token_Bucket: unknown field",
		`{"tokenbucket": {}}`:                      "tokenbucket: unknown field",
		`{"entries": [{"Key": "k"}]}`:              "entries[0].Key: unknown field",
		`{"match": {"u": "1"}, "match_x": {}}`:     "match_x: unknown field",
		`{"token_bucket": {"max_tokens": "1\u0"}}`: `invalid character '"' at offset 37 in a \u escape`,
	} {
		var c conf
		assert.EqualError(t, proto.Unmarshal([]byte(in), &c), want, in)
	}
	// Without it, neither spelling nor strings are protobuf's.
	assert.EqualError(t, Unmarshal([]byte(`{"tokenBucket": {}}`), &c), "tokenBucket: unknown field")
	assert.EqualError(t, Unmarshal([]byte(`{"shadow": "false"}`), &c), "shadow: want a boolean, not a string")
	assert.EqualError(t, Unmarshal([]byte(`{"port": "80"}`), &c), "port: want a number, not a string")
}

func TestCamelIsProtobufsJSONName(t *testing.T) {
	for name, want := range map[string]string{
		"name": "name", "stat_prefix": "statPrefix", "tags_to_remove": "tagsToRemove",
		"a_1b": "a1b", "x__y": "xY", "trailing_": "trailing", "_lead": "Lead", "max_tokens": "maxTokens",
	} {
		assert.Equal(t, want, camel(name), name)
	}
}
