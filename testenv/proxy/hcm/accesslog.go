package hcm

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// DefaultAccessLogFormat is Envoy's default access log format.
const DefaultAccessLogFormat = `[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" ` +
	`%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ` +
	`%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" ` +
	`"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"` + "\n"

type accessLog struct {
	mu   sync.Mutex
	w    io.Writer
	text string
	json map[string]string
}

// files are shared per path within a process so that listeners logging to one file do
// not interleave partial lines.
var fileMu sync.Mutex

func newAccessLog(al *accesslogv3.AccessLog, defaultOut io.Writer) (*accessLog, error) {
	if defaultOut == nil {
		defaultOut = os.Stdout
	}
	l := &accessLog{text: DefaultAccessLogFormat}
	var format *corev3.SubstitutionFormatString
	switch al.GetTypedConfig().GetTypeUrl() {
	case "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog":
		f := &filev3.FileAccessLog{}
		if err := al.GetTypedConfig().UnmarshalTo(f); err != nil {
			return nil, err
		}
		switch f.GetPath() {
		case "/dev/stdout":
			l.w = defaultOut
		case "/dev/stderr":
			l.w = os.Stderr
		default:
			fileMu.Lock()
			fh, err := os.OpenFile(f.GetPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			fileMu.Unlock()
			if err != nil {
				return nil, fmt.Errorf("access log %s: %w", f.GetPath(), err)
			}
			l.w = fh
		}
		format = f.GetLogFormat()
		if tf := f.GetFormat(); tf != "" { //nolint:staticcheck // deprecated but still sent
			l.text = tf
		}
	case "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog":
		f := &streamv3.StdoutAccessLog{}
		if err := al.GetTypedConfig().UnmarshalTo(f); err != nil {
			return nil, err
		}
		l.w = defaultOut
		format = f.GetLogFormat()
	case "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StderrAccessLog":
		f := &streamv3.StderrAccessLog{}
		if err := al.GetTypedConfig().UnmarshalTo(f); err != nil {
			return nil, err
		}
		l.w = os.Stderr
		format = f.GetLogFormat()
	default:
		return nil, fmt.Errorf("access logger %s: type %s is not supported", al.GetName(), al.GetTypedConfig().GetTypeUrl())
	}
	if format != nil {
		switch ff := format.GetFormat().(type) {
		case *corev3.SubstitutionFormatString_TextFormat:
			l.text = ff.TextFormat
		case *corev3.SubstitutionFormatString_TextFormatSource:
			l.text = ff.TextFormatSource.GetInlineString()
		case *corev3.SubstitutionFormatString_JsonFormat:
			l.json = map[string]string{}
			for k, v := range ff.JsonFormat.GetFields() {
				l.json[k] = v.GetStringValue()
			}
		}
	}
	return l, nil
}

var commandRe = regexp.MustCompile(`%([A-Z_]+)(\(([^)]*)\))?(:\d+)?%`)

func (l *accessLog) log(s *Stream) {
	snap := s.Info.Snapshot()
	var line string
	if l.json != nil {
		out := map[string]any{}
		for k, v := range l.json {
			val := formatCommands(v, s, snap, true)
			if val == "" {
				out[k] = nil
				continue
			}
			if n, err := strconv.ParseInt(val, 10, 64); err == nil && commandRe.MatchString(v) && strings.TrimSpace(v) == v && isNumericCommand(v) {
				out[k] = n
				continue
			}
			out[k] = val
		}
		b, _ := json.Marshal(out)
		line = string(b) + "\n"
	} else {
		line = formatCommands(l.text, s, snap, false)
	}
	l.mu.Lock()
	_, _ = io.WriteString(l.w, line)
	l.mu.Unlock()
}

func isNumericCommand(v string) bool {
	switch v {
	case "%RESPONSE_CODE%", "%BYTES_RECEIVED%", "%BYTES_SENT%", "%DURATION%":
		return true
	}
	return false
}

// formatCommands substitutes Envoy's command operators; an unknown or empty value is "-"
// in text logs and null in JSON logs.
func formatCommands(format string, s *Stream, snap streaminfo.Snapshot, forJSON bool) string {
	return commandRe.ReplaceAllStringFunc(format, func(m string) string {
		sub := commandRe.FindStringSubmatch(m)
		v := command(sub[1], sub[3], s, snap)
		if sub[4] != "" {
			if n, err := strconv.Atoi(sub[4][1:]); err == nil && len(v) > n {
				v = v[:n]
			}
		}
		if v == "" && !forJSON {
			return "-"
		}
		return v
	})
}

func command(name, arg string, s *Stream, snap streaminfo.Snapshot) string {
	switch name {
	case "START_TIME":
		return s.Info.StartTime.UTC().Format("2006-01-02T15:04:05.000Z")
	case "REQ":
		for _, h := range strings.Split(arg, "?") {
			if v := requestHeader(s, strings.ToLower(h)); v != "" {
				return v
			}
		}
		return ""
	case "RESP":
		if s.Response == nil {
			return ""
		}
		for _, h := range strings.Split(arg, "?") {
			if v := s.Response.Header.Get(h); v != "" {
				return v
			}
		}
		return ""
	case "PROTOCOL":
		return s.Info.Protocol
	case "RESPONSE_CODE":
		return strconv.Itoa(snap.Code)
	case "RESPONSE_FLAGS":
		return streaminfo.FormatFlags(snap.Flags)
	case "RESPONSE_CODE_DETAILS":
		return snap.Details
	case "BYTES_RECEIVED":
		return strconv.FormatUint(snap.BytesIn, 10)
	case "BYTES_SENT":
		return strconv.FormatUint(snap.BytesOut, 10)
	case "DURATION":
		return strconv.FormatInt(snap.Duration.Milliseconds(), 10)
	case "UPSTREAM_HOST":
		return snap.UpstreamHost
	case "UPSTREAM_CLUSTER":
		return snap.ClusterName
	case "UPSTREAM_LOCAL_ADDRESS":
		return snap.UpstreamLocal
	case "UPSTREAM_TRANSPORT_FAILURE_REASON":
		return snap.UpstreamFailure
	case "DOWNSTREAM_REMOTE_ADDRESS", "DOWNSTREAM_PEER_ADDRESS":
		return s.Info.DownstreamPeer
	case "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT":
		return stripPort(s.Info.DownstreamPeer)
	case "DOWNSTREAM_LOCAL_ADDRESS":
		return s.Info.DownstreamLocal
	case "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT":
		return stripPort(s.Info.DownstreamLocal)
	case "ROUTE_NAME":
		return snap.RouteName
	case "UPSTREAM_REQUEST_ATTEMPT_COUNT":
		return strconv.Itoa(snap.Attempts)
	case "REQUEST_DURATION", "RESPONSE_DURATION":
		return strconv.FormatInt(snap.Duration.Milliseconds(), 10)
	case "HOSTNAME":
		h, _ := os.Hostname()
		return h
	case "CONNECTION_TERMINATION_DETAILS":
		return ""
	}
	return tlsCommand(name, s.Info.DownstreamTLS, snap.UpstreamTLS)
}

func requestHeader(s *Stream, name string) string {
	r := s.Request
	switch name {
	case ":method":
		return r.Method
	case ":path":
		return r.URL.RequestURI()
	case ":authority", "host":
		return r.Host
	case ":scheme":
		if s.Info.DownstreamTLS != nil {
			return "https"
		}
		return "http"
	}
	return r.Header.Get(name)
}

func stripPort(a string) string {
	if i := strings.LastIndex(a, ":"); i > 0 {
		return a[:i]
	}
	return a
}
