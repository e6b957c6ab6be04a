package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// FieldError is a validation failure at a field path below spec (e.g. "ports[0].number").
type FieldError struct {
	Field string
	Err   error
}

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

func validateDNSLabel(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%q is longer than %d characters", s, max)
	}
	if !dnsLabel.MatchString(s) {
		return fmt.Errorf("%q is not a lowercase DNS name", s)
	}
	return nil
}

var hostLabel = regexp.MustCompile(`^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`)

// validateHost accepts an FQDN or short name, optionally with a leading "*." wildcard.
func validateHost(h string, allowWildcard bool) error {
	if h == "" {
		return errors.New("empty host")
	}
	if h == "*" {
		if allowWildcard {
			return nil
		}
		return errors.New(`"*" is not allowed here`)
	}
	rest := h
	if strings.HasPrefix(h, "*.") {
		if !allowWildcard {
			return fmt.Errorf("wildcard host %q is not allowed here", h)
		}
		rest = h[2:]
	}
	if len(rest) > 253 {
		return fmt.Errorf("host %q is too long", h)
	}
	for _, l := range strings.Split(rest, ".") {
		if !hostLabel.MatchString(l) || len(l) > 63 {
			return fmt.Errorf("invalid host %q", h)
		}
	}
	return nil
}

// Protocols Istio accepts on a port, upper case.
var protocols = map[string]bool{
	"HTTP": true, "HTTPS": true, "HTTP2": true, "GRPC": true, "GRPC-WEB": true, "TCP": true,
	"TLS": true, "UDP": true, "MONGO": true, "REDIS": true, "MYSQL": true,
}

func validatePortNumber(field string, n uint32, allowZero bool) *FieldError {
	if (n == 0 && !allowZero) || n > 65535 {
		return fieldErr(field, "port %d out of range 1-65535", n)
	}
	return nil
}

func validateLabels(field string, labels map[string]string) *FieldError {
	for k, v := range labels {
		if k == "" || len(k) > 317 {
			return fieldErr(field, "invalid label key %q", k)
		}
		if len(v) > 63 {
			return fieldErr(field+"."+k, "label value longer than 63 characters")
		}
	}
	return nil
}

func validateGateway(m proto.Message) *FieldError {
	if len(m.(*networking.Gateway).GetServers()) == 0 {
		return fieldErr("servers", "at least one server is required")
	}
	return nil
}
