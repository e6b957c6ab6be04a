package proxyconfig

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// Source is a proxy's admin API: Get fetches a path of it ("/config_dump", ...). Each method
// prints one of istioctl's proxy-config views, a table or (format json or yaml) the
// resources as the proxy wrote them.
type Source struct {
	Get func(path string) ([]byte, error)
}

func (s *Source) dump() (*Dump, error) {
	body, err := s.Get("/config_dump")
	if err != nil {
		return nil, err
	}
	return ParseDump(body)
}

// Clusters prints the clusters that pass f.
func (s *Source) Clusters(w io.Writer, format string, f ClusterFilter) error {
	if err := f.Validate(); err != nil {
		return err
	}
	d, err := s.dump()
	if err != nil {
		return err
	}
	if format != "table" {
		return rawOut(w, format)(d.RawResources("clusters", f.Keep))
	}
	cs, err := d.Clusters(f)
	if err != nil {
		return err
	}
	return WriteClusters(w, cs)
}

// Listeners prints the listeners that pass f.
func (s *Source) Listeners(w io.Writer, format string, f ListenerFilter) error {
	d, err := s.dump()
	if err != nil {
		return err
	}
	ls, err := d.Listeners(f)
	if err != nil {
		return err
	}
	if format != "table" {
		names := map[string]bool{}
		for _, l := range ls {
			names[l.GetName()] = true
		}
		return rawOut(w, format)(d.RawResources("listeners", func(n string) bool { return names[n] }))
	}
	return WriteListeners(w, ls)
}

// Routes prints the route configurations named name ("": all).
func (s *Source) Routes(w io.Writer, format, name string) error {
	d, err := s.dump()
	if err != nil {
		return err
	}
	if format != "table" {
		return rawOut(w, format)(d.RawResources("routes", func(n string) bool { return name == "" || n == name }))
	}
	rs, err := d.Routes(name)
	if err != nil {
		return err
	}
	return WriteRoutes(w, rs)
}

// Endpoints prints the hosts of /clusters that pass f.
func (s *Source) Endpoints(w io.Writer, format string, f EndpointFilter) error {
	body, err := s.Get("/clusters?format=json")
	if err != nil {
		return err
	}
	c, err := ParseClusters(body)
	if err != nil {
		return err
	}
	if format != "table" {
		var top struct {
			Statuses []json.RawMessage `json:"cluster_statuses"`
		}
		if err := json.Unmarshal(body, &top); err != nil {
			return err
		}
		keep := map[string]bool{}
		for _, e := range Endpoints(c, f) {
			keep[e.Cluster] = true
		}
		out := []json.RawMessage{}
		for i, cs := range c.GetClusterStatuses() {
			if i < len(top.Statuses) && keep[cs.GetName()] {
				out = append(out, top.Statuses[i])
			}
		}
		return WriteRaw(w, format, out)
	}
	return WriteEndpoints(w, Endpoints(c, f))
}

// Secrets prints the SDS secrets; now decides whether a certificate is valid.
func (s *Source) Secrets(w io.Writer, format string, now time.Time) error {
	d, err := s.dump()
	if err != nil {
		return err
	}
	if format != "table" {
		raw, ok := d.Raw["secrets"]
		if !ok {
			return fmt.Errorf("the config dump has no secrets section")
		}
		return WriteRaw(w, format, raw)
	}
	secrets, err := d.Secrets(now)
	if err != nil {
		return err
	}
	return WriteSecrets(w, secrets)
}

// Bootstrap prints the bootstrap section, or its summary as a table.
func (s *Source) Bootstrap(w io.Writer, format string) error {
	d, err := s.dump()
	if err != nil {
		return err
	}
	if format == "table" {
		return d.WriteBootstrap(w)
	}
	raw, ok := d.Raw["bootstrap"]
	if !ok {
		return fmt.Errorf("the config dump has no bootstrap section")
	}
	return WriteRaw(w, format, raw)
}

func rawOut(w io.Writer, format string) func([]json.RawMessage, error) error {
	return func(items []json.RawMessage, err error) error {
		if err != nil {
			return err
		}
		return WriteRaw(w, format, items)
	}
}
