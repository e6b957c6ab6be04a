package inject

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"istio.io/api/annotation"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// LifecycleAnnotation (wasmesh) holds the sidecar's own lifecycle, a Kubernetes Lifecycle
// in JSON or YAML: it replaces the postStart and preStop the template would give the proxy
// (seed 004: an application with its own shutdown needs the proxy's to match it).
const LifecycleAnnotation = "sidecar.wasmesh.io/proxyLifecycle"

// annotationChecks are the pod annotations the template reads, each with the check that
// refuses a value the template would turn into a broken pod: Istio's list
// (pkg/kube/inject/validate.go), plus those wasmesh reads strictly where Istio falls back.
var annotationChecks = map[string]func(string) error{
	annotation.SidecarInterceptionMode.Name:                   checkInterceptionMode,
	annotation.SidecarStatusPort.Name:                         checkPort,
	annotation.SidecarStatusReadinessInitialDelaySeconds.Name: checkInt32,
	annotation.SidecarStatusReadinessPeriodSeconds.Name:       checkPositiveInt32,
	annotation.SidecarStatusReadinessFailureThreshold.Name:    checkPositiveInt32,
	annotation.SidecarStatusReadinessApplicationPorts.Name:    checkPorts,
	annotation.SidecarTrafficIncludeOutboundIPRanges.Name:     checkIncludeCIDRs,
	annotation.SidecarTrafficExcludeOutboundIPRanges.Name:     checkCIDRs,
	annotation.SidecarTrafficIncludeInboundPorts.Name:         checkIncludePorts,
	annotation.SidecarTrafficExcludeInboundPorts.Name:         checkPorts,
	annotation.SidecarTrafficIncludeOutboundPorts.Name:        checkPorts,
	annotation.SidecarTrafficExcludeOutboundPorts.Name:        checkPorts,
	annotation.SidecarTrafficExcludeInterfaces.Name:           checkInterfaces,
	annotation.SidecarTrafficKubevirtInterfaces.Name:          checkInterfaces,
	annotation.PrometheusMergeMetrics.Name:                    checkBool,
	annotation.ProxyConfig.Name:                               checkProxyConfig,
	annotation.SidecarProxyCPU.Name:                           checkQuantity,
	annotation.SidecarProxyMemory.Name:                        checkQuantity,
	annotation.SidecarProxyCPULimit.Name:                      checkQuantity,
	annotation.SidecarProxyMemoryLimit.Name:                   checkQuantity,
	annotation.SidecarNativeSidecar.Name:                      checkBool,
	annotation.SidecarRewriteAppHTTPProbers.Name:              checkBool,
	annotation.SidecarProxyImage.Name:                         checkImage,
	annotation.SidecarLogLevel.Name:                           checkProxyLogLevel,
	annotation.SidecarComponentLogLevel.Name:                  checkComponentLogLevel,
	annotation.SidecarAgentLogLevel.Name:                      checkAgentLogLevel,
	annotation.SidecarBootstrapOverride.Name:                  checkConfigMapName,
	annotation.SidecarUserVolume.Name:                         func(v string) error { _, err := userVolumes(v); return err },
	annotation.SidecarUserVolumeMount.Name:                    func(v string) error { _, err := userVolumeMounts(v); return err },
	LifecycleAnnotation:                                       func(v string) error { _, err := parseLifecycle(v); return err },
}

// annotationError names the annotation and its value.
func annotationError(name, value string, err error) error {
	return fmt.Errorf("invalid value %q for annotation %s: %w", value, name, err)
}

// checkAnnotations checks every annotation the template reads; the error names each bad
// one (in name order).
func checkAnnotations(annotations map[string]string) error {
	names := make([]string, 0, len(annotations))
	for name := range annotations {
		if annotationChecks[name] != nil {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		if err := annotationChecks[name](annotations[name]); err != nil {
			errs = append(errs, annotationError(name, annotations[name], err))
		}
	}
	return errors.Join(errs...)
}

// checkInterceptionMode allows what discovery generates for (docs/contracts.md): REDIRECT
// and NONE. Istio's TPROXY is refused rather than given listeners it would not work with.
func checkInterceptionMode(v string) error {
	switch v {
	case "REDIRECT", "NONE":
		return nil
	case "TPROXY":
		return errors.New("TPROXY is not supported by wasmesh; use REDIRECT or NONE")
	}
	return errors.New("want REDIRECT or NONE")
}

func parsePort(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 || n > 65535 {
		return 0, fmt.Errorf("%q is not a port", v)
	}
	return n, nil
}

func checkPort(v string) error { _, err := parsePort(v); return err }

// parsePorts reads a comma-separated port list (empty: none).
func parsePorts(v string) ([]int, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []int
	for _, p := range strings.Split(v, ",") {
		n, err := parsePort(p)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func checkPorts(v string) error { _, err := parsePorts(v); return err }

func checkIncludePorts(v string) error {
	if v == "*" {
		return nil
	}
	return checkPorts(v)
}

func checkInt32(v string) error {
	if n, err := strconv.ParseInt(v, 10, 32); err != nil || n < 0 {
		return errors.New("want a non-negative integer")
	}
	return nil
}

func checkPositiveInt32(v string) error {
	if n, err := strconv.ParseInt(v, 10, 32); err != nil || n < 1 {
		return errors.New("want a positive integer")
	}
	return nil
}

func checkCIDRs(v string) error {
	if v == "" {
		return nil
	}
	for _, c := range strings.Split(v, ",") {
		if _, err := netip.ParsePrefix(strings.TrimSpace(c)); err != nil {
			return fmt.Errorf("%q is not a CIDR", c)
		}
	}
	return nil
}

func checkIncludeCIDRs(v string) error {
	if v == "*" {
		return nil
	}
	return checkCIDRs(v)
}

var interfaceName = regexp.MustCompile(`^[A-Za-z0-9_.:@-]{1,15}$`)

func checkInterfaces(v string) error {
	for _, name := range strings.Split(v, ",") {
		if !interfaceName.MatchString(strings.TrimSpace(name)) {
			return fmt.Errorf("%q is not a network interface name", name)
		}
	}
	return nil
}

func checkBool(v string) error {
	if _, err := strconv.ParseBool(v); err != nil {
		return errors.New("want true or false")
	}
	return nil
}

func checkQuantity(v string) error {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return err
	}
	if q.Sign() < 0 {
		return errors.New("must not be negative")
	}
	return nil
}

func checkImage(v string) error {
	if v == "" || strings.ContainsAny(v, " \t\n") {
		return errors.New("want an image reference")
	}
	return nil
}

// Envoy's log levels (the proxy's --log-level).
var proxyLevels = []string{"trace", "debug", "info", "warning", "warn", "error", "critical", "off"}

func checkProxyLogLevel(v string) error {
	for _, l := range proxyLevels {
		if v == l {
			return nil
		}
	}
	return fmt.Errorf("want one of %s", strings.Join(proxyLevels, ", "))
}

func checkComponentLogLevel(v string) error {
	for _, part := range strings.Split(v, ",") {
		comp, lvl, ok := strings.Cut(part, ":")
		if !ok || comp == "" || checkProxyLogLevel(lvl) != nil {
			return fmt.Errorf("%q: want <component>:<level>, levels %s", part, strings.Join(proxyLevels, ", "))
		}
	}
	return nil
}

// The agent reads one <scope>:<level> (or a level), levels as slog names them.
var agentLevel = regexp.MustCompile(`^([A-Za-z0-9_-]+:)?(debug|info|warn|error)$`)

func checkAgentLogLevel(v string) error {
	if !agentLevel.MatchString(v) {
		return errors.New("want <scope>:<level> with level debug, info, warn or error")
	}
	return nil
}

func checkConfigMapName(v string) error {
	if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
		return fmt.Errorf("not a ConfigMap name: %s", strings.Join(errs, "; "))
	}
	return nil
}
