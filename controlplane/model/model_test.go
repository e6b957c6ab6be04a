package model

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A port's protocol field wins; without one, the name's prefix picks it, as Istio's
// explicit protocol selection does, with grpc-web (the one name with a hyphen) matched whole.
func TestParseProtocol(t *testing.T) {
	cases := []struct {
		protocol, name string
		want           Protocol
	}{
		{"http", "tcp-x", HTTP},
		{"grpc", "grpc-web", GRPC},
		{"", "http-web", HTTP},
		{"", "HTTP2", HTTP2},
		{"", "grpc", GRPC},
		{"", "grpc-x", GRPC},
		{"", "grpc-web", GRPCWeb},
		{"", "GRPC-Web-ui", GRPCWeb},
		{"", "https", HTTPS},
		{"", "tls-db", TLS},
		{"", "udp-dns", UDP},
		{"", "mongo", Mongo},
		{"", "redis-cache", Redis},
		{"", "mysql", MySQL},
		{"", "db", TCP},
		{"", "", TCP},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, ParseProtocol(c.protocol, c.name), "protocol %q, name %q", c.protocol, c.name)
	}
}
