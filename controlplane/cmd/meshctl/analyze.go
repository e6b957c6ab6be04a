package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/analyze"
)

// Exit codes, istioctl's (istioctl/cmd/sysexits.go).
const (
	exitUsage       = 64 // bad command line
	exitDataError   = 65 // a file could not be parsed
	exitFoundIssues = 79 // analyze found issues at or above the failure threshold
)

// exitError is an error with the process exit code it means.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// exitCode is the exit code of a command's error: its own, else 1 (istioctl's unknown error).
func exitCode(err error) int {
	if e, ok := errors.AsType[*exitError](err); ok {
		return e.code
	}
	return 1
}

func usageError(err error) error { return &exitError{exitUsage, err} }

// analyzeCommand is istioctl analyze over files and directories.
func analyzeCommand() *cobra.Command {
	var output, failure, shown string
	var skipModules, useKube, allNamespaces bool
	var kf kubeFlags
	cmd := &cobra.Command{
		Use:   "analyze FILE|DIR...",
		Short: "Check Istio configuration offline, as istioctl analyze does",
		Long: `analyze reads Istio YAML (files, or directories read as discovery's --configDir reads
them) and reports, as istioctl analyze does, every document discovery would reject (IST0106,
with the field at fault) and what the valid configs get wrong together: a VirtualService
routing to an unknown host or to a subset no DestinationRule defines (IST0101), a
DestinationRule for an unknown host (IST0174) or with a subset selecting no WorkloadEntry
or ServiceEntry endpoint of the input (IST0173), and wasmesh's own: a Sidecar egress that
imports nothing (WSM0001), an EnvoyFilter that patches nothing (WSM0002), DestinationRules
discovery merges that set one thing twice (WSM0003), a WasmPlugin whose module cannot be
read or fetched or fails its sha256 (WSM0004). A Kubernetes Service in the input is a host
routes may name (its pods, unknown offline, may have any label its selector does not
contradict); other Kubernetes objects are skipped.

With --kubernetes (-k, --use-kube) the live cluster is analyzed, as istioctl analyze's
default: its Istio objects (read as discovery's Kubernetes source reads them), Services and
running Pods (a subset must select one of a Service's pods). Files given too are analyzed
over the cluster's configuration: a file's config replaces the cluster's of the same kind,
namespace and name. Every namespace is read; the messages are those of --namespace (the
context's, else default) or, with -A, of all. A cluster's object has no file:line.

Exit codes, istioctl's: 0 when nothing reaches --failure-threshold, 79 when something does
(with the log output, as istioctl: -o json|yaml exits 0), 65 when a document is not YAML,
64 for a bad command line, 1 for other errors (an unreadable path).`,
		Example: `  meshctl analyze configs/
  meshctl analyze vs.yaml dr.yaml --failure-threshold Warning
  meshctl analyze configs/ -o json
  meshctl analyze --kubernetes -n shop
  meshctl analyze -k -A new-route.yaml --kubeconfig ~/.kube/config`,
		RunE: func(cmd *cobra.Command, args []string) error {
			failAt, err := analyze.ParseLevel(failure)
			if err != nil {
				return usageError(fmt.Errorf("--failure-threshold: %w", err))
			}
			showAt, err := analyze.ParseLevel(shown)
			if err != nil {
				return usageError(fmt.Errorf("--output-threshold: %w", err))
			}
			if output != "log" && output != "json" && output != "yaml" {
				return usageError(fmt.Errorf("--output %q: want log, json or yaml", output))
			}
			opts := analyze.Options{SkipModules: skipModules}
			target := ""
			if useKube {
				if opts.Cluster, opts.Namespace, target, err = readCluster(cmd, &kf, allNamespaces); err != nil {
					return err
				}
			}
			res, err := analyze.Paths(args, opts)
			if err != nil {
				return err
			}
			return printAnalysis(cmd, res, output, target, failAt, showAt)
		},
	}
	cmd.Args = func(_ *cobra.Command, args []string) error {
		if len(args) == 0 && !useKube {
			return usageError(errors.New("give the files or directories to analyze, or --kubernetes"))
		}
		return nil
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	f := cmd.Flags()
	f.StringVarP(&output, "output", "o", "log", "output format: log, json or yaml")
	f.StringVar(&failure, "failure-threshold", "Error", "the level at which a finding gives a non-zero exit code: Info, Warning, Error")
	f.StringVar(&shown, "output-threshold", "Info", "the level from which findings are printed: Info, Warning, Error")
	f.BoolVar(&skipModules, "skip-wasm-fetch", false, "do not read or fetch WasmPlugin modules")
	f.BoolVarP(&useKube, "use-kube", "k", false, "analyze the live cluster (files given too are applied over it)")
	f.BoolVar(&useKube, "kubernetes", false, "the same as --use-kube")
	f.BoolVarP(&allNamespaces, "all-namespaces", "A", false, "with --kubernetes: the messages of every namespace")
	kf.add(cmd)
	return cmd
}

// readCluster reads the cluster for analyze --kubernetes: its state, the namespace whose
// messages are shown ("" with -A) and how istioctl names that target.
func readCluster(cmd *cobra.Command, kf *kubeFlags, all bool) (*analyze.Cluster, string, string, error) {
	cfg, err := kf.restConfig()
	if err != nil {
		return nil, "", "", err
	}
	ns, target := "", "all namespaces"
	if !all {
		if ns, err = kf.ns(); err != nil {
			return nil, "", "", err
		}
		target = "namespace: " + ns
	}
	c, err := analyze.ReadCluster(cmd.Context(), cfg)
	if err != nil {
		return nil, "", "", fmt.Errorf("reading the cluster at %s: %w", cfg.Host, err)
	}
	if ns != "" && !slices.ContainsFunc(c.Namespaces, func(n string) bool { return n == ns }) {
		// istioctl says so too (and analyzes nothing).
		return nil, "", "", fmt.Errorf("namespace %q not found in the cluster at %s", ns, cfg.Host)
	}
	return c, ns, target, nil
}

// printAnalysis prints the findings as istioctl does; target names the cluster analyzed
// ("namespace: default"), "" offline.
func printAnalysis(cmd *cobra.Command, res *analyze.Result, output, target string, failAt, showAt analyze.Level) error {
	shown := []analyze.Message{}
	failed := false
	for _, m := range res.Messages {
		if m.Severity() >= showAt {
			shown = append(shown, m)
		}
		failed = failed || m.Severity() >= failAt
	}
	out := cmd.OutOrStdout()
	switch output {
	case "json", "yaml":
		b, err := json.MarshalIndent(shown, "", "  ")
		if err != nil {
			return err
		}
		if output == "yaml" {
			if b, err = yaml.JSONToYAML(b); err != nil {
				return err
			}
		}
		_, err = fmt.Fprintln(out, strings.TrimRight(string(b), "\n"))
		return err // istioctl sets no exit code with these formats
	}
	for _, m := range shown {
		fmt.Fprintln(out, m.String())
	}
	if len(res.ParseErrors) > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "Error(s) adding files:\n  - %s\n", strings.Join(res.ParseErrors, "\n  - "))
	}
	analyzed := strings.Join(res.Files, ", ")
	if target != "" {
		analyzed = strings.TrimSuffix(target+", "+analyzed, ", ")
	}
	if len(shown) == 0 {
		what := "files"
		if target != "" {
			what = target
		}
		if n := len(res.ParseErrors); n > 0 {
			what = fmt.Sprintf("%s (but %d documents could not be parsed)", what, n)
		}
		if len(res.Files) == 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "\u2714 No validation issues found when analyzing %s.\n", what)
		} else {
			fmt.Fprintf(cmd.ErrOrStderr(), "\u2714 No validation issues found when analyzing %s:\n  - %s\n", what, strings.Join(res.Files, "\n  - "))
		}
	}
	switch {
	case failed:
		return &exitError{exitFoundIssues, errors.New("analyzers found issues when analyzing " + analyzed)}
	case len(res.ParseErrors) > 0:
		return &exitError{exitDataError, errors.New("some files couldn't be parsed")}
	}
	return nil
}
