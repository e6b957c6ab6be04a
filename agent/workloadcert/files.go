package workloadcert

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/wasmesh/wasmesh/agent/certwatch"
)

// The mounted files' names, Istio's.
const (
	CertChainFile = "cert-chain.pem"
	KeyFile       = "key.pem"
	RootCertFile  = "root-cert.pem"
)

// DefaultCredentialsDir is where Istio's agent looks for mounted workload credentials
// to serve over SDS instead of asking the CA (relative to the working directory).
const DefaultCredentialsDir = "./var/run/secrets/workload-spiffe-credentials"

// FileNames are the three files of a credentials directory.
func FileNames(dir string) []string {
	return []string{filepath.Join(dir, CertChainFile), filepath.Join(dir, KeyFile), filepath.Join(dir, RootCertFile)}
}

// FilesPresent says whether dir holds the three files; a missing directory is not an error.
func FilesPresent(dir string) (bool, error) {
	for _, f := range FileNames(dir) {
		if _, err := os.Stat(f); errors.Is(err, fs.ErrNotExist) {
			return false, nil
		} else if err != nil {
			return false, fmt.Errorf("workload credentials: %w", err)
		}
	}
	return true, nil
}

// LoadFiles reads and checks a credentials directory.
func LoadFiles(dir string) (*Bundle, error) {
	var parts [3][]byte
	for i, f := range FileNames(dir) {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("workload credentials: %w", err)
		}
		parts[i] = b
	}
	b, err := NewBundle(parts[0], parts[1], parts[2])
	if err != nil {
		return nil, fmt.Errorf("workload credentials in %s: %w", dir, err)
	}
	return b, nil
}

// Files serves mounted certificates and follows their changes (package certwatch: file
// events and a periodic hash), as Istio's agent does with mounted workload credentials.
type Files struct {
	Dir      string
	Interval time.Duration
	Served   *Served
	Log      *slog.Logger
}

// Run publishes the files' bundle now and after every change, until ctx ends. Files
// that do not make a valid bundle (half written, a key of another certificate) are
// logged and the last good bundle stays served; one nearing its end is logged.
func (f *Files) Run(ctx context.Context, publish func(*Bundle)) {
	log := f.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("scope", "workloadcert", "dir", f.Dir)
	if f.Served != nil {
		interval := f.Interval
		if interval <= 0 {
			interval = certwatch.DefaultInterval
		}
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { f.Served.WatchExpiry(ctx, interval, log) })
	}
	certwatch.New(FileNames(f.Dir), f.Interval, log).Run(ctx, func(string) {
		b, err := LoadFiles(f.Dir)
		if err != nil {
			log.Warn("mounted certificates not usable; serving the last good ones", "err", err)
			return
		}
		if f.Served != nil {
			f.Served.Set(b)
		}
		log.Info("mounted workload certificate loaded", describe(b)...)
		publish(b)
	})
}
