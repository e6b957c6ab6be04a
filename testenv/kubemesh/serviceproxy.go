package kubemesh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ServiceProxy is the smallest kube-proxy for one port of one Service, where there is no
// kube-proxy (the pods are processes of this machine): it listens on an address of its own,
// watches the Service's EndpointSlices and sends each new connection to one of the ready
// endpoints of that port, picked at random, as kube-proxy's iptables mode does. An endpoint
// that stops being ready or leaves the slices gets no new connection; connections already
// made stay until either side ends them. A refused dial tries the other ready endpoints
// (an endpoint may be gone before its slice says so), where kube-proxy would fail the
// connection.
type ServiceProxy struct {
	namespace, service, port string
	listener                 net.Listener
	cancel                   context.CancelFunc
	done                     sync.WaitGroup

	mu     sync.Mutex
	ready  map[string][]string // slice name → ready endpoints host:port of the port
	active map[string]int      // endpoint → open connections through the proxy
	conns  map[net.Conn]struct{}
	closed bool
}

// StartServiceProxy serves the Service's port named port on listen (host:port, port 0 for
// any) until Close. It returns once the EndpointSlices are listed. It forwards bytes (TCP):
// TLS is between the client and the endpoint.
func StartServiceProxy(ctx context.Context, kc kubernetes.Interface, namespace, service, port, listen string) (*ServiceProxy, error) {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("service proxy for %s/%s:%s: %w", namespace, service, port, err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	p := &ServiceProxy{namespace: namespace, service: service, port: port, listener: l, cancel: cancel,
		ready: map[string][]string{}, active: map[string]int{}, conns: map[net.Conn]struct{}{}}
	f := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = discoveryv1.LabelServiceName + "=" + service }))
	inf := f.Discovery().V1().EndpointSlices().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { p.slice(o, false) },
		UpdateFunc: func(_, o any) { p.slice(o, false) },
		DeleteFunc: func(o any) { p.slice(o, true) },
	}); err != nil {
		cancel()
		l.Close()
		return nil, err
	}
	f.Start(pctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		p.Close()
		return nil, fmt.Errorf("service proxy for %s/%s:%s: EndpointSlices not listed: %w", namespace, service, port, ctx.Err())
	}
	p.done.Add(1)
	go p.serve()
	return p, nil
}

// Addr is where the proxy listens.
func (p *ServiceProxy) Addr() string { return p.listener.Addr().String() }

// Ready returns the ready endpoints (host:port), sorted.
func (p *ServiceProxy) Ready() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, eps := range p.ready {
		out = append(out, eps...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Active returns the open connections through the proxy by endpoint.
func (p *ServiceProxy) Active() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.active {
		if v > 0 {
			out[k] = v
		}
	}
	return out
}

// Close stops listening and watching and closes every connection.
func (p *ServiceProxy) Close() {
	p.cancel()
	p.listener.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.done.Wait()
}

func (p *ServiceProxy) slice(o any, deleted bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o, deleted = d.Obj, true
	}
	sl, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	var eps []string
	if !deleted {
		eps = readyEndpoints(sl, p.port)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(eps) == 0 {
		delete(p.ready, sl.Name)
		return
	}
	p.ready[sl.Name] = eps
}

// readyEndpoints are the addresses of the slice's ready endpoints with the port named port.
func readyEndpoints(sl *discoveryv1.EndpointSlice, port string) []string {
	var num int32
	for _, sp := range sl.Ports {
		if sp.Name != nil && *sp.Name == port && sp.Port != nil {
			num = *sp.Port
		}
	}
	if num == 0 {
		return nil
	}
	var out []string
	for _, e := range sl.Endpoints {
		if e.Conditions.Ready != nil && !*e.Conditions.Ready {
			continue
		}
		for _, a := range e.Addresses {
			out = append(out, net.JoinHostPort(a, strconv.Itoa(int(num))))
		}
	}
	return out
}

func (p *ServiceProxy) serve() {
	defer p.done.Done()
	for {
		c, err := p.listener.Accept()
		if err != nil {
			return
		}
		if !p.track(c, true) {
			c.Close()
			return
		}
		p.done.Add(1)
		go func() {
			defer p.done.Done()
			defer p.track(c, false)
			p.forward(c)
		}()
	}
}

// track adds or removes a connection to close on Close; false once closed.
func (p *ServiceProxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// forward connects c to a ready endpoint and copies both ways until either side ends,
// then closes both.
func (p *ServiceProxy) forward(c net.Conn) {
	defer c.Close()
	up, ep, err := p.dial()
	if err != nil {
		return
	}
	if !p.track(up, true) {
		up.Close()
		return
	}
	defer p.track(up, false)
	defer func() {
		p.mu.Lock()
		p.active[ep]--
		p.mu.Unlock()
	}()
	done := make(chan struct{}, 2)
	for _, pair := range [][2]net.Conn{{up, c}, {c, up}} {
		go func() { _, _ = io.Copy(pair[0], pair[1]); done <- struct{}{} }()
	}
	<-done
	up.Close()
	c.Close()
	<-done
}

// dial connects to a ready endpoint picked at random, the others in turn if it refuses.
func (p *ServiceProxy) dial() (net.Conn, string, error) {
	eps := p.Ready()
	rand.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
	var errs []error
	for _, ep := range eps {
		up, err := net.DialTimeout("tcp", ep, 2*time.Second)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.mu.Lock()
		p.active[ep]++
		p.mu.Unlock()
		return up, ep, nil
	}
	if len(errs) == 0 {
		return nil, "", fmt.Errorf("service %s/%s: no ready endpoint for port %s", p.namespace, p.service, p.port)
	}
	return nil, "", errors.Join(errs...)
}
