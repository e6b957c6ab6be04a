// Package hotrestart hands a running meshproxy's listening sockets to its successor, as
// Envoy's hot restart does: epoch N listens on a unix domain socket named from the base id
// and its epoch; epoch N+1 (same --base-id, --restart-epoch N+1) connects to it, receives
// every listening socket and the admin socket as file descriptors (SCM_RIGHTS), has epoch
// N stop serving its admin API and serves it instead (Envoy's child shuts the parent's admin
// down as it starts), accepts on the listening sockets once it is initialized and then tells
// epoch N to drain; epoch N stops accepting (the sockets stay open in the child, so no
// queued connection is lost), drains its connections and exits after
// --parent-shutdown-time-s.
package hotrestart

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"

	"golang.org/x/sys/unix"
)

// SocketName is the abstract unix socket of an epoch ("@" puts it in Linux's abstract
// namespace, as Envoy's domain sockets are).
func SocketName(baseID uint64, epoch int) string {
	return fmt.Sprintf("@meshproxy_hot_restart_%d_%d", baseID, epoch)
}

const adminKey = "admin"

type request struct {
	Op string `json:"op"` // "sockets", "admin", "drain", "terminate"
}

type reply struct {
	Keys  []string `json:"keys,omitempty"`
	Error string   `json:"error,omitempty"`
}

// Provider is the running epoch, as its successor needs it.
type Provider interface {
	// Sockets are the listening sockets by key.
	Sockets() map[string]net.Listener
	// AdminListener is the admin socket (nil without admin).
	AdminListener() net.Listener
	// ShutdownAdmin stops serving the admin socket: the next epoch took it.
	ShutdownAdmin()
	// Drain stops accepting and drains; the provider exits after the parent shutdown time.
	Drain()
	// Terminate exits now.
	Terminate()
}

// Serve answers the next epoch on this epoch's socket until ctx ends.
func Serve(ctx context.Context, baseID uint64, epoch int, p Provider) error {
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: SocketName(baseID, epoch), Net: "unix"})
	if err != nil {
		return fmt.Errorf("hot restart: listen %s: %w", SocketName(baseID, epoch), err)
	}
	go func() {
		<-ctx.Done()
		_ = lis.Close()
	}()
	go func() {
		for {
			c, err := lis.AcceptUnix()
			if err != nil {
				return
			}
			go serveConn(c, p)
		}
	}()
	return nil
}

func serveConn(c *net.UnixConn, p Provider) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var req request
		if json.Unmarshal(line, &req) != nil {
			return
		}
		switch req.Op {
		case "sockets":
			if err := sendSockets(c, p); err != nil {
				return
			}
		case "admin":
			p.ShutdownAdmin()
			_ = writeReply(c, reply{}, nil)
		case "drain":
			p.Drain()
			_ = writeReply(c, reply{}, nil)
		case "terminate":
			_ = writeReply(c, reply{}, nil)
			p.Terminate()
			return
		}
	}
}

func writeReply(c *net.UnixConn, rep reply, fds []int) error {
	b, _ := json.Marshal(rep)
	b = append(b, '\n')
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := c.WriteMsgUnix(b, oob, nil)
	return err
}

func sendSockets(c *net.UnixConn, p Provider) error {
	socks := p.Sockets()
	if a := p.AdminListener(); a != nil {
		socks[adminKey] = a
	}
	keys := make([]string, 0, len(socks))
	for k := range socks {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var fds []int
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	var sent []string
	for _, k := range keys {
		fl, ok := socks[k].(interface{ File() (*os.File, error) })
		if !ok {
			continue
		}
		f, err := fl.File()
		if err != nil {
			continue
		}
		files = append(files, f)
		fds = append(fds, int(f.Fd()))
		sent = append(sent, k)
	}
	return writeReply(c, reply{Keys: sent}, fds)
}

// Parent is the previous epoch as seen by its successor.
type Parent struct {
	conn *net.UnixConn
	r    *bufio.Reader

	mu      sync.Mutex
	sockets map[string]net.Listener
}

// Connect reaches epoch-1 and takes its sockets. It returns nil, nil when epoch is 0 or
// no previous epoch listens (a fresh start).
func Connect(baseID uint64, epoch int) (*Parent, error) {
	if epoch <= 0 {
		return nil, nil
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: SocketName(baseID, epoch-1), Net: "unix"})
	if err != nil {
		return nil, nil
	}
	p := &Parent{conn: c, r: bufio.NewReader(c), sockets: map[string]net.Listener{}}
	if err := p.send("sockets"); err != nil {
		c.Close()
		return nil, err
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*256))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("hot restart: read sockets: %w", err)
	}
	var rep reply
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		c.Close()
		return nil, fmt.Errorf("hot restart: bad reply: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("hot restart: control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		f, err := unix.ParseUnixRights(&m)
		if err == nil {
			fds = append(fds, f...)
		}
	}
	if len(fds) != len(rep.Keys) {
		c.Close()
		return nil, errors.New("hot restart: descriptor count does not match")
	}
	for i, k := range rep.Keys {
		f := os.NewFile(uintptr(fds[i]), k)
		l, err := net.FileListener(f)
		_ = f.Close()
		if err != nil {
			continue
		}
		p.sockets[k] = l
	}
	return p, nil
}

func (p *Parent) send(op string) error {
	b, _ := json.Marshal(request{Op: op})
	_, err := p.conn.Write(append(b, '\n'))
	return err
}

// Take implements listener.SocketSource.
func (p *Parent) Take(key string) (net.Listener, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.sockets[key]
	delete(p.sockets, key)
	return l, ok
}

// TakeAdmin returns the parent's admin socket; the parent stops serving it, so that from
// now on every admin request reaches this epoch.
func (p *Parent) TakeAdmin(string) (net.Listener, bool) {
	l, ok := p.Take(adminKey)
	if ok && p.send("admin") == nil {
		_, _ = p.r.ReadBytes('\n')
	}
	return l, ok
}

// DrainParent asks the parent to stop accepting and drain.
func (p *Parent) DrainParent() {
	if p.send("drain") == nil {
		_, _ = p.r.ReadBytes('\n')
	}
	// Sockets the new configuration did not take are of no use: close our copies.
	p.mu.Lock()
	for k, l := range p.sockets {
		_ = l.Close()
		delete(p.sockets, k)
	}
	p.mu.Unlock()
}

// Terminate tells the parent to exit now.
func (p *Parent) Terminate() {
	_ = p.send("terminate")
	_ = p.conn.Close()
}
