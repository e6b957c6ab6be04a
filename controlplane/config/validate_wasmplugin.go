package config

import (
	"fmt"
	"net/url"
	"regexp"

	"google.golang.org/protobuf/proto"
	extensions "istio.io/api/extensions/v1alpha1"
	typev1beta1 "istio.io/api/type/v1beta1"
)

// WasmPlugin is validated field by field, as EnvoyFilter is.

var sha256Hex = regexp.MustCompile(`^[a-f0-9]{64}$`)

// cIdentifier is what Istio accepts as a VM environment variable name.
var cIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validateWasmPluginSpec checks a WasmPlugin. Modules come from file:// (read by the proxy) or
// http(s):// with a sha256 (fetched and verified by discovery); OCI images need a registry
// client wasmesh does not have and are rejected.
func validateWasmPluginSpec(m proto.Message) *FieldError {
	wp := m.(*extensions.WasmPlugin)
	if wp.GetTargetRef() != nil {
		return fieldErr("targetRef", errTargetRefs)
	}
	if len(wp.GetTargetRefs()) > 0 {
		return fieldErr("targetRefs", errTargetRefs)
	}
	if s := wp.GetSelector(); s != nil {
		if fe := validateLabels("selector.matchLabels", s.GetMatchLabels()); fe != nil {
			return fe
		}
	}
	if wp.GetUrl() == "" {
		return fieldErr("url", "a module URL is required")
	}
	u, err := url.Parse(wp.GetUrl())
	if err != nil {
		return fieldErr("url", "%v", err)
	}
	if s := wp.GetSha256(); s != "" && !sha256Hex.MatchString(s) {
		return fieldErr("sha256", "%q is not 64 lowercase hex digits", s)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || u.Path == "" {
			return fieldErr("url", "%q: a file URL is file:///absolute/path.wasm", wp.GetUrl())
		}
	case "http", "https":
		if u.Host == "" {
			return fieldErr("url", "%q has no host", wp.GetUrl())
		}
		if wp.GetSha256() == "" {
			return fieldErr("sha256", "required for %s modules: discovery fetches the module once and caches and verifies it by its digest", u.Scheme)
		}
	case "oci", "":
		return fieldErr("url", "%q: OCI images are not supported (no registry client); use file:// or http(s):// with sha256", wp.GetUrl())
	default:
		return fieldErr("url", "%q: scheme %q is not one of file, http, https", wp.GetUrl(), u.Scheme)
	}
	if wp.GetImagePullSecret() != "" {
		return fieldErr("imagePullSecret", "not supported: it authenticates OCI registry pulls, and wasmesh fetches modules over plain http(s)")
	}
	if wp.GetVerificationKey() != "" {
		return fieldErr("verificationKey", "not supported (Istio does not implement it either); use sha256")
	}
	if len(wp.GetPluginName()) > 256 {
		return fieldErr("pluginName", "longer than 256 characters")
	}
	if wp.GetType() == extensions.PluginType_NETWORK {
		return fieldErr("type", "NETWORK plugins are not supported: wasmesh's proxies run HTTP Wasm filters")
	}
	for i, e := range wp.GetVmConfig().GetEnv() {
		f := fmt.Sprintf("vmConfig.env[%d]", i)
		if !cIdentifier.MatchString(e.GetName()) {
			return fieldErr(f+".name", "%q is not a C identifier", e.GetName())
		}
		if e.GetValueFrom() == extensions.EnvValueSource_HOST && e.GetValue() != "" {
			return fieldErr(f+".value", "a HOST variable takes its value from the proxy's environment; value must be empty")
		}
	}
	for i, ts := range wp.GetMatch() {
		for j, p := range ts.GetPorts() {
			if fe := validatePortNumber(fmt.Sprintf("match[%d].ports[%d].number", i, j), p.GetNumber(), false); fe != nil {
				return fe
			}
		}
		if ts.GetMode() > typev1beta1.WorkloadMode_CLIENT_AND_SERVER {
			return fieldErr(fmt.Sprintf("match[%d].mode", i), "unknown mode %v", ts.GetMode())
		}
	}
	return nil
}
