package discovery

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/controlplane/debug"
)

// adminMux is the HTTP server of --httpAddr: metrics and the debug pages, read-only (GET and
// HEAD only; anything else 405), and the one page that changes state, /debug/logging, whose
// PUT or POST is allowed only from a loopback peer or with a credential of discovery's own
// namespace (istiod's allowAuthenticatedOrLocalhost, and its debug authorization that gives
// the system namespace the full set).
func (d *Discovery) adminMux() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", readOnly(debug.Handler(debug.Deps{
		Pusher: d.Pusher, Server: d.Server, Configs: d.State, Objects: d.objects, Documents: d.documents, Mesh: d.Mesh, Registry: d.State.Registry,
		Workloads: d.State.Entries.Workloads, Gatherer: d.Reg, NotInForce: d.State.Entries.NotInForce, Extensions: d.extensionStatus,
		Instance: d.opts.Identity,
	})))
	if d.opts.LogLevels != nil {
		levels := d.opts.LogLevels.Handler()
		mux.Handle("/debug/logging", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.Method {
			case http.MethodGet, http.MethodHead:
			case http.MethodPut, http.MethodPost:
				if !d.mayChange(w, r) {
					return
				}
			default:
				w.Header().Set("Allow", "GET, HEAD, PUT, POST")
				http.Error(w, r.Method+" not allowed: GET reads the log levels, PUT or POST changes one", http.StatusMethodNotAllowed)
				return
			}
			levels.ServeHTTP(w, r)
		}))
	}
	mux.Handle("/debug/leader", readOnly(d.leaderHandler()))
	return mux
}

// readOnly answers GET and HEAD with h, any other method 405: a page that only reads never
// changes state, whatever the method.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, r.Method+" not allowed: this page is read-only (GET, HEAD)", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// mayChange reports whether r may change state: from a loopback peer, or with
// `Authorization: Bearer <credential>` (the CA's rules) of discovery's namespace. Otherwise
// it answers 401 (no valid credential) or 403 (another namespace's) and says why; the
// credential itself is never logged.
func (d *Discovery) mayChange(w http.ResponseWriter, r *http.Request) bool {
	if loopbackPeer(r.RemoteAddr) {
		return true
	}
	err := d.adminCaller(r)
	if err == nil {
		return true
	}
	d.log.Warn("admin request refused", "peer", r.RemoteAddr, "path", r.URL.Path, "method", r.Method, "error", err)
	code := http.StatusUnauthorized
	var denied *forbiddenError
	if errors.As(err, &denied) {
		code = http.StatusForbidden
	}
	http.Error(w, fmt.Sprintf("%s %s changes state: allowed from localhost or with a credential of namespace %s: %v",
		r.Method, r.URL.Path, d.namespace(), err), code)
	return false
}

type forbiddenError struct{ msg string }

func (e *forbiddenError) Error() string { return e.msg }

// adminCaller checks r's bearer credential.
func (d *Discovery) adminCaller(r *http.Request) error {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return errors.New(`no "Authorization: Bearer <credential>" header`)
	}
	if d.certService == nil {
		return errors.New("discovery checks no credentials (no CA: secureGRPCAddr)")
	}
	c, err := d.certService.AuthenticateToken(r.Context(), strings.TrimSpace(token))
	if err != nil {
		return errors.New(status.Convert(err).Message())
	}
	if c.Namespace != d.namespace() {
		return &forbiddenError{fmt.Sprintf("the credential is %s/%s's, not of namespace %s", c.Namespace, c.ServiceAccount, d.namespace())}
	}
	return nil
}

// loopbackPeer reports whether a request's remote address is a loopback one.
func loopbackPeer(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
