// Command meshctl is wasmesh's operator tool, as istioctl: today kube-inject, the sidecar
// injector's template applied offline to Kubernetes YAML.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/controlplane/inject"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
)

func main() {
	if err := newCommand().ExecuteContext(context.Background()); err != nil {
		os.Exit(exitCode(err))
	}
}

func newCommand() *cobra.Command {
	root := &cobra.Command{
		Use:          "meshctl",
		Short:        "wasmesh's command-line tool (istioctl's verbs)",
		SilenceUsage: true,
	}
	root.AddCommand(kubeInjectCommand())
	root.AddCommand(proxyStatusCommand())
	root.AddCommand(proxyConfigCommand())
	root.AddCommand(analyzeCommand())
	root.AddCommand(experimentalCommand())
	return root
}

// kubeInjectCommand is istioctl kube-inject, with its flags.
func kubeInjectCommand() *cobra.Command {
	var file, output, meshFile, injectFile, valuesFile, native string
	cmd := &cobra.Command{
		Use:   "kube-inject -f FILE",
		Short: "Inject the sidecar into the pods of Kubernetes YAML, as the injection webhook would",
		Long: `kube-inject reads Kubernetes objects (multi-document YAML or JSON; "-" is stdin) and
prints them with the wasmesh sidecar injected into every pod they make: Pods,
Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs. It applies the
template discovery's /inject webhook applies, configured the same way: the mesh config
(the "mesh" key of the istio ConfigMap), and the injector's "config" and "values" (the
keys of the istio-sidecar-injector ConfigMap). A pod is injected unless it opts out
(sidecar.istio.io/inject: "false"): the namespace's policy is not known offline.`,
		Example: `  meshctl kube-inject -f deployment.yaml | kubectl apply -f -
  meshctl kube-inject -f app.yaml --meshConfigFile mesh.yaml --valuesFile values.yaml -o injected.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := kubeInjectOptions(meshFile, injectFile, valuesFile, native)
			if err != nil {
				return err
			}
			opts.Warn = func(w string) { fmt.Fprintln(cmd.ErrOrStderr(), "Warning:", w) }
			return kubeInject(cmd, opts, file, output)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "filename", "f", "", `input Kubernetes YAML ("-": stdin)`)
	f.StringVarP(&output, "output", "o", "", "write here instead of stdout")
	f.StringVar(&meshFile, "meshConfigFile", "", "mesh config YAML (default: wasmesh's defaults)")
	f.StringVar(&injectFile, "injectConfigFile", "", `the injector's "config" (policy, selectors, injectedAnnotations)`)
	f.StringVar(&valuesFile, "valuesFile", "", `the injector's "values" (global.hub, global.proxy.image, ...)`)
	f.StringVar(&native, "nativeSidecars", "false", "run the proxy as a native sidecar unless the values or the pod say: true or false")
	_ = cmd.MarkFlagRequired("filename")
	return cmd
}

// kubeInjectOptions reads the configuration files (each optional).
func kubeInjectOptions(meshFile, injectFile, valuesFile, native string) (inject.KubeOptions, error) {
	var opts inject.KubeOptions
	read := func(path string) ([]byte, error) {
		if path == "" {
			return nil, nil
		}
		return os.ReadFile(path)
	}
	cfg, err := read(injectFile)
	if err != nil {
		return opts, err
	}
	vals, err := read(valuesFile)
	if err != nil {
		return opts, err
	}
	if opts.Config, err = inject.ParseConfig(cfg, vals); err != nil {
		return opts, err
	}
	opts.Mesh = mesh.Default()
	if meshFile != "" {
		data, err := os.ReadFile(meshFile)
		if err != nil {
			return opts, err
		}
		if opts.Mesh, err = mesh.Parse(meshFile, data); err != nil {
			return opts, err
		}
	}
	mode, err := inject.ParseNativeMode(native)
	if err != nil || mode == inject.NativeAuto {
		return opts, fmt.Errorf("--nativeSidecars %q: want true or false (offline, no cluster tells)", native)
	}
	opts.NativeSidecars = mode == inject.NativeTrue
	return opts, nil
}

func kubeInject(cmd *cobra.Command, opts inject.KubeOptions, file, output string) error {
	var in io.Reader = cmd.InOrStdin()
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	out := cmd.OutOrStdout()
	if output != "" {
		f, err := os.Create(output)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	if err := inject.KubeInject(opts, in, out); err != nil {
		return fmt.Errorf("kube-inject %s: %w", file, err)
	}
	return nil
}
