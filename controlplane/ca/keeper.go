package ca

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// KeeperOptions say where the mesh's CA is kept. A plugged-in CA wins: PluggedDir, else (on
// Kubernetes) the Secret cacerts; then the self-signed root of the Secret SecretName (on
// Kubernetes), else of Dir.
type KeeperOptions struct {
	// PluggedDir holds Istio's cacerts files (--caCertsDir); they must load.
	PluggedDir string
	// Client and Namespace: the Secrets cacerts and SecretName (default DefaultSecret) in
	// discovery's namespace.
	Client     kubernetes.Interface
	Namespace  string
	SecretName string
	// Dir keeps the self-signed root without Kubernetes (--caDir); root-cert.pem there is the
	// root file of the local mesh.
	Dir string
	Log *slog.Logger
}

// Keeper holds the CA in force and reads its store again on Refresh: a CA replaced there is
// adopted, and a deleted Secret is created again with the CA in use.
type Keeper struct {
	opts KeeperOptions
	log  *slog.Logger
	now  func() time.Time

	mu         sync.RWMutex
	current    *Authority
	fromSecret bool // current is the shared Secret's self-signed CA
	changed    chan struct{}
}

// NewKeeper checks the options; Refresh reads the CA.
func NewKeeper(opts KeeperOptions) (*Keeper, error) {
	if opts.PluggedDir == "" && opts.Client == nil && opts.Dir == "" {
		return nil, errors.New("the CA needs a place to keep its root: caDir, caCertsDir, or the Kubernetes API server")
	}
	if opts.Client != nil && opts.Namespace == "" {
		return nil, errors.New("the CA's Secret needs discovery's namespace")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	return &Keeper{opts: opts, log: opts.Log.With("scope", "ca"), now: time.Now, changed: make(chan struct{})}, nil
}

// Refresh reads the CA from where it is kept (creating a self-signed root where there is
// none) and puts it in force.
func (k *Keeper) Refresh(ctx context.Context) (*Authority, error) {
	a, fromSecret, err := k.load(ctx)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.current == nil || !bytes.Equal(k.current.CertPEM, a.CertPEM) || !bytes.Equal(k.current.RootPEM, a.RootPEM) {
		if k.current != nil {
			k.log.Warn("CA replaced where it is kept; adopting it", "subject", a.Cert.Subject.String(), "notAfter", a.Cert.NotAfter)
		}
		k.current, k.fromSecret = a, fromSecret
		close(k.changed)
		k.changed = make(chan struct{})
	}
	return k.current, nil
}

func (k *Keeper) load(ctx context.Context) (*Authority, bool, error) {
	o := k.opts
	if o.PluggedDir != "" {
		a, err := LoadPluggedDir(o.PluggedDir)
		if err == nil && o.Dir != "" && o.Client == nil { // the local mesh's root file
			err = writeFile(o.Dir, RootCertFile, a.RootPEM, 0o644)
		}
		return a, false, err
	}
	if o.Client != nil {
		a, err := PluggedFromSecret(ctx, o.Client, o.Namespace)
		if a != nil || err != nil {
			return a, false, err
		}
		var inUse *Authority
		k.mu.RLock()
		if k.fromSecret {
			inUse = k.current
		}
		k.mu.RUnlock()
		a, err = SecretStore{Client: o.Client, Namespace: o.Namespace, Name: o.SecretName, Log: k.log}.Shared(ctx, inUse, k.now())
		return a, true, err
	}
	a, created, err := LoadOrCreateDir(o.Dir, k.now())
	if created {
		k.log.Info("self-signed root CA created", "caDir", o.Dir, "notAfter", a.Cert.NotAfter)
	}
	return a, false, err
}

// Current is the CA in force (nil before the first Refresh).
func (k *Keeper) Current() *Authority {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.current
}

// Changed is closed at the next change of the CA after the call.
func (k *Keeper) Changed() <-chan struct{} {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.changed
}
