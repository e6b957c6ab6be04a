package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type listener struct {
	name      string
	addr      string
	direction string // "static", "inbound", "outbound"
	ln        net.Listener
	srv       *http.Server
	closed    bool
}

type proxy struct {
	o        options
	raw      []byte
	doc      bootstrapDoc
	admin    string
	clusters map[string]string
	stats    *statStore

	mu         sync.Mutex
	state      string
	configured bool
	inbound    []string
	outbound   []string
	listeners  []*listener
	adminLn    net.Listener
	adminSrv   *http.Server
	// adminPosts are the admin POSTs received (path and query), in order, leaving out
	// the tests' /testproxy/ knobs: GET /testproxy/admin_posts lists them.
	adminPosts []string

	exit chan int
}

func newProxy(o options, doc bootstrapDoc, raw []byte) (*proxy, error) {
	admin, err := doc.Admin.Address.hostPort()
	if err != nil {
		return nil, fmt.Errorf("bootstrap admin address: %w", err)
	}
	p := &proxy{
		o: o, raw: raw, doc: doc, admin: admin,
		clusters: doc.clusterAddrs(),
		stats:    newStatStore(compileTags(&doc)),
		state:    "PRE_INITIALIZING",
		exit:     make(chan int, 4),
	}
	if n, _ := strconv.Atoi(os.Getenv("TESTPROXY_SERIES")); n > 0 {
		for i := 0; i < n; i++ {
			p.stats.get(fmt.Sprintf("wasmcustom.reporter=.=destination;.;source_workload=.=w%d;.;response_code=.=200;.;istio_requests_total", i), false).add(int64(i + 1))
		}
	}
	return p, nil
}

// reusePort lets two epochs bind the same listener address during a hot restart, which
// Envoy achieves by passing sockets over its hot-restart channel.
var reusePort = net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, 0xf /* SO_REUSEPORT */, 1)
	})
	if err != nil {
		return err
	}
	return serr
}}

func (p *proxy) serve(ctx context.Context) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.stats.get("server.state", true).set(2)
	p.stats.get("server.live", true).set(0)

	var parent net.Conn
	if p.o.epoch > 0 {
		c, inherited, err := p.connectParent()
		if err != nil {
			return 1, fmt.Errorf("hot restart: cannot reach epoch %d: %w", p.o.epoch-1, err)
		}
		parent = c
		defer parent.Close()
		p.configured = inherited.Configured && childInit() == 0
		p.inbound, p.outbound = inherited.Inbound, inherited.Outbound
	}
	if err := p.startAdmin(); err != nil {
		return 1, err
	}
	defer p.adminSrv.Close()
	if err := p.startStaticListeners(); err != nil {
		return 1, err
	}
	if err := p.bindDynamic(p.inbound, "inbound"); err != nil {
		return 1, err
	}
	if err := p.bindDynamic(p.outbound, "outbound"); err != nil {
		return 1, err
	}
	if os.Getenv("TESTPROXY_CONFIG_ON_START") == "1" && (parent == nil || childInit() == 0) {
		p.markConfigured()
	}
	p.mu.Lock()
	if p.configured {
		p.setStateLocked("LIVE")
	} else {
		p.setStateLocked("INITIALIZING")
	}
	p.mu.Unlock()

	// This epoch's own hot-restart socket, for its future child.
	sock := socketPath(p.o, p.o.epoch)
	_ = os.Remove(sock)
	hl, err := net.Listen("unix", sock)
	if err != nil {
		return 1, fmt.Errorf("hot restart socket: %w", err)
	}
	defer os.Remove(sock)
	defer hl.Close()
	go p.acceptChild(ctx, hl)

	if parent != nil {
		if d := childInit(); d > 0 {
			// Envoy's order: the child initializes (fetches its first config) while the
			// parent keeps serving, and only then tells the parent to drain.
			select {
			case <-time.After(d):
				p.markConfigured()
			case <-ctx.Done():
				return 0, nil
			}
		}
		if _, err := fmt.Fprintln(parent, "drain"); err != nil {
			return 1, fmt.Errorf("hot restart: drain parent: %w", err)
		}
		go func() {
			t := time.NewTimer(p.o.parentShutdown)
			defer t.Stop()
			select {
			case <-t.C:
				fmt.Fprintln(parent, "terminate")
			case <-ctx.Done():
			}
		}()
	}
	log.Printf("epoch %d serving admin on %s", p.o.epoch, p.admin)

	select {
	case <-ctx.Done():
		return 0, nil
	case code := <-p.exit:
		return code, nil
	}
}

type inheritedState struct {
	Configured bool     `json:"configured"`
	Inbound    []string `json:"inbound"`
	Outbound   []string `json:"outbound"`
}

// connectParent asks the previous epoch to hand over its admin (it closes it) and tells
// which listeners its configuration had, standing in for the config discovery would
// give the new epoch.
func (p *proxy) connectParent() (net.Conn, inheritedState, error) {
	var st inheritedState
	c, err := net.Dial("unix", socketPath(p.o, p.o.epoch-1))
	if err != nil {
		return nil, st, err
	}
	if _, err := fmt.Fprintln(c, "hello"); err != nil {
		c.Close()
		return nil, st, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return nil, st, err
	}
	if err := json.Unmarshal([]byte(line), &st); err != nil {
		c.Close()
		return nil, st, err
	}
	return c, st, nil
}

func (p *proxy) acceptChild(ctx context.Context, hl net.Listener) {
	for {
		c, err := hl.Accept()
		if err != nil {
			return
		}
		go p.serveChild(ctx, c)
	}
}

func (p *proxy) serveChild(ctx context.Context, c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		switch strings.TrimSpace(line) {
		case "hello":
			p.mu.Lock()
			st := inheritedState{Configured: p.configured, Inbound: p.inbound, Outbound: p.outbound}
			p.adminLn.Close()
			p.adminSrv.SetKeepAlivesEnabled(false)
			p.mu.Unlock()
			b, _ := json.Marshal(st)
			fmt.Fprintf(c, "%s\n", b)
			log.Printf("epoch %d handed its admin to epoch %d", p.o.epoch, p.o.epoch+1)
		case "drain":
			p.mu.Lock()
			p.setStateLocked("DRAINING")
			for _, l := range p.listeners {
				p.closeListenerLocked(l, true)
			}
			p.mu.Unlock()
			log.Printf("epoch %d draining for the hot restart", p.o.epoch)
		case "terminate":
			log.Printf("epoch %d terminated by its child", p.o.epoch)
			p.exit <- 0
			return
		}
	}
}

func (p *proxy) setStateLocked(s string) {
	p.state = s
	code := map[string]int64{"LIVE": 0, "DRAINING": 1, "PRE_INITIALIZING": 2, "INITIALIZING": 3}[s]
	p.stats.get("server.state", true).set(code)
	live := int64(0)
	if s == "LIVE" {
		live = 1
	}
	p.stats.get("server.live", true).set(live)
}

func (p *proxy) markConfigured() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.configured = true
	p.stats.get("cluster_manager.cds.update_success", false).add(1)
	p.stats.get("listener_manager.lds.update_success", false).add(1)
	if p.state == "INITIALIZING" || p.state == "PRE_INITIALIZING" {
		p.setStateLocked("LIVE")
	}
}

func statAddr(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	return host + "_" + port
}

// track counts a server's connections into listener.<addr>.downstream_cx_active.
func (p *proxy) track(srv *http.Server, statName string) {
	active := p.stats.get("listener."+statName+".downstream_cx_active", true)
	total := p.stats.get("listener."+statName+".downstream_cx_total", false)
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			active.add(1)
			total.add(1)
		case http.StateClosed, http.StateHijacked:
			active.add(-1)
		}
	}
}

func (p *proxy) startAdmin() error {
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", p.admin); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // the parent is releasing the port
	}
	if err != nil {
		return fmt.Errorf("admin %s: %w", p.admin, err)
	}
	p.adminLn = ln
	p.adminSrv = &http.Server{Handler: p.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
	p.track(p.adminSrv, "admin")
	go p.adminSrv.Serve(ln)
	return nil
}

func (p *proxy) startStaticListeners() error {
	for _, l := range p.doc.StaticResources.Listeners {
		addr, err := l.Address.hostPort()
		if err != nil {
			return fmt.Errorf("listener %s: %w", l.Name, err)
		}
		var routes []route
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
				for _, vh := range f.TypedConfig.RouteConfig.VirtualHosts {
					for _, r := range vh.Routes {
						if r.Match.Path != "" {
							routes = append(routes, route{prefix: r.Match.Path, exact: true, cluster: r.Route.Cluster})
						} else {
							routes = append(routes, route{prefix: r.Match.Prefix, cluster: r.Route.Cluster})
						}
					}
				}
			}
		}
		if err := p.bind(l.Name, addr, "static", p.router(routes)); err != nil {
			return err
		}
	}
	return nil
}

func (p *proxy) router(routes []route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, rt := range routes {
			if (rt.exact && r.URL.Path == rt.prefix) || (!rt.exact && strings.HasPrefix(r.URL.Path, rt.prefix)) {
				target, ok := p.clusters[rt.cluster]
				if !ok {
					http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
					return
				}
				rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: target})
				rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
					http.Error(w, "upstream connect error: "+err.Error(), http.StatusServiceUnavailable)
				}
				rp.ServeHTTP(w, r)
				return
			}
		}
		http.NotFound(w, r)
	})
}

func (p *proxy) bind(name, addr, direction string, h http.Handler) error {
	ln, err := reusePort.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return fmt.Errorf("listener %s on %s: %w", name, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	p.track(srv, statAddr(addr))
	l := &listener{name: name, addr: addr, direction: direction, ln: ln, srv: srv}
	p.mu.Lock()
	p.listeners = append(p.listeners, l)
	p.mu.Unlock()
	go srv.Serve(ln)
	return nil
}

func (p *proxy) bindDynamic(addrs []string, direction string) error {
	for _, a := range addrs {
		dir := direction
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if ms, err := strconv.Atoi(r.URL.Query().Get("ms")); err == nil && r.URL.Path == "/slow" {
				select {
				case <-time.After(time.Duration(ms) * time.Millisecond):
				case <-r.Context().Done():
					return
				}
			}
			fmt.Fprintf(w, "%s %s epoch %d\n", dir, a, p.o.epoch)
		})
		if err := p.bind(dir+"_"+statAddr(a), a, dir, h); err != nil {
			return err
		}
	}
	return nil
}

// closeListenerLocked stops accepting; graceful keeps open connections until their
// current request ends (keep-alive off), as Envoy's graceful drain closes them.
func (p *proxy) closeListenerLocked(l *listener, graceful bool) {
	if l.closed {
		return
	}
	l.closed = true
	l.ln.Close()
	if graceful {
		l.srv.SetKeepAlivesEnabled(false)
	} else {
		l.srv.Close()
	}
}

func (p *proxy) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		s := p.state
		p.mu.Unlock()
		if s != "LIVE" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, s)
	})
	mux.HandleFunc("/server_info", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		s := p.state
		p.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{
			"version": "testproxy", "state": s,
			"command_line_options": map[string]any{
				"restart_epoch": p.o.epoch, "service_cluster": p.o.serviceCluster, "service_node": p.o.serviceNode,
				"drain_time":           fmt.Sprintf("%ds", int(p.o.drainTime.Seconds())),
				"parent_shutdown_time": fmt.Sprintf("%ds", int(p.o.parentShutdown.Seconds())),
			},
		})
	})
	mux.HandleFunc("/listeners", func(w http.ResponseWriter, r *http.Request) {
		type sa struct {
			Address string `json:"address"`
			Port    int    `json:"port_value"`
		}
		var out []map[string]any
		p.mu.Lock()
		for _, l := range p.listeners {
			if l.closed {
				continue
			}
			host, port, _ := net.SplitHostPort(l.addr)
			n, _ := strconv.Atoi(port)
			out = append(out, map[string]any{"name": l.name, "local_address": map[string]any{"socket_address": sa{host, n}}})
		}
		p.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{"listener_statuses": out})
	})
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var filter *regexp.Regexp
		if f := q.Get("filter"); f != "" {
			var err error
			if filter, err = regexp.Compile(f); err != nil {
				http.Error(w, "Invalid regex: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		_, usedOnly := q["usedonly"]
		fmt.Fprint(w, p.stats.text(usedOnly, filter))
	})
	mux.HandleFunc("/stats/prometheus", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write(p.stats.prometheus())
	})
	mux.HandleFunc("/testproxy/admin_posts", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.adminPosts {
			fmt.Fprintln(w, c)
		}
	})
	mux.HandleFunc("/config_dump", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"configs":[{"@type":"type.googleapis.com/envoy.admin.v3.BootstrapConfigDump","bootstrap":%s}]}`, p.raw)
	})
	p.adminPostHandlers(mux)
	return mux
}

// adminPostHandlers adds the admin API's POST endpoints and the tests' /testproxy/ knobs.
func (p *proxy) adminPostHandlers(mux *http.ServeMux) {
	// exitAfter carries an exit code requested by a handler; the process exits only
	// after the response is on the wire, as Envoy answers /quitquitquit first.
	post := func(path string, f func(r *http.Request) error) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				http.Error(w, "This endpoint requires POST", http.StatusMethodNotAllowed)
				return
			}
			if !strings.HasPrefix(r.URL.Path, "/testproxy/") {
				p.mu.Lock()
				p.adminPosts = append(p.adminPosts, r.URL.RequestURI())
				p.mu.Unlock()
			}
			err := f(r)
			var ex *exitAfter
			if errors.As(err, &ex) {
				// A length, not chunks: the terminating chunk would be written only when
				// the handler returns, which the exit may not wait for.
				w.Header().Set("Connection", "close")
				w.Header().Set("Content-Length", "3")
				fmt.Fprint(w, "OK\n")
				http.NewResponseController(w).Flush()
				p.exit <- ex.code
				return
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fmt.Fprintln(w, "OK")
		})
	}
	post("/drain_listeners", func(r *http.Request) error {
		q := r.URL.Query()
		_, inboundOnly := q["inboundonly"]
		_, graceful := q["graceful"]
		p.mu.Lock()
		var drained []*listener
		for _, l := range p.listeners {
			if inboundOnly && l.direction != "inbound" {
				continue
			}
			if !graceful {
				p.closeListenerLocked(l, false)
				continue
			}
			// Graceful: keep accepting for the drain time while open connections are told
			// to close after their request, then stop accepting.
			l.srv.SetKeepAlivesEnabled(false)
			drained = append(drained, l)
		}
		p.mu.Unlock()
		if len(drained) > 0 {
			time.AfterFunc(p.o.drainTime, func() {
				p.mu.Lock()
				defer p.mu.Unlock()
				for _, l := range drained {
					p.closeListenerLocked(l, true)
				}
			})
		}
		log.Printf("epoch %d draining listeners (inboundonly=%v graceful=%v)", p.o.epoch, inboundOnly, graceful)
		return nil
	})
	post("/healthcheck/fail", func(*http.Request) error {
		p.mu.Lock()
		p.setStateLocked("DRAINING")
		p.mu.Unlock()
		return nil
	})
	post("/healthcheck/ok", func(*http.Request) error {
		p.mu.Lock()
		if p.configured {
			p.setStateLocked("LIVE")
		}
		p.mu.Unlock()
		return nil
	})
	post("/quitquitquit", func(*http.Request) error {
		log.Printf("epoch %d quitting", p.o.epoch)
		return &exitAfter{0}
	})
	// Test knobs: the part of discovery and of a misbehaving proxy the tests need.
	post("/testproxy/xds", func(r *http.Request) error {
		var body struct {
			Inbound  []string `json:"inbound"`
			Outbound []string `json:"outbound"`
		}
		if r.ContentLength != 0 {
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
				return err
			}
		}
		if err := p.bindDynamic(body.Inbound, "inbound"); err != nil {
			return err
		}
		if err := p.bindDynamic(body.Outbound, "outbound"); err != nil {
			return err
		}
		p.mu.Lock()
		p.inbound = append(p.inbound, body.Inbound...)
		p.outbound = append(p.outbound, body.Outbound...)
		p.mu.Unlock()
		p.markConfigured()
		return nil
	})
	post("/testproxy/exit", func(r *http.Request) error {
		code, err := strconv.Atoi(r.URL.Query().Get("code"))
		if err != nil {
			return errors.New("code=<n> required")
		}
		return &exitAfter{code}
	})
	post("/testproxy/stat", func(r *http.Request) error {
		q := r.URL.Query()
		v, err := strconv.ParseInt(q.Get("value"), 10, 64)
		if err != nil || q.Get("name") == "" {
			return errors.New("name=<stat>&value=<n> required")
		}
		p.stats.get(q.Get("name"), false).add(v)
		return nil
	})
}

// exitAfter is returned by an admin handler to exit once its response is sent.
type exitAfter struct{ code int }

func (e *exitAfter) Error() string { return fmt.Sprintf("exit %d", e.code) }

// childInit is TESTPROXY_CHILD_INIT: how long an epoch after the first stays INITIALIZING.
func childInit() time.Duration {
	d, _ := time.ParseDuration(os.Getenv("TESTPROXY_CHILD_INIT"))
	return d
}
