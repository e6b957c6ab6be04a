// Command manifests writes what installs discovery on Kubernetes into one directory: Istio's
// CRDs of the kinds discovery watches (crds.yaml, from the istio.io/api module this build
// uses) and the manifests of controlplane/deploy beside them. `make manifests` runs it into
// build/deploy/, for `kubectl apply -f build/deploy/`.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/controlplane/deploy"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	var out string
	var opts deploy.Options
	cmd := &cobra.Command{
		Use:          "manifests",
		Short:        "write discovery's Kubernetes manifests and Istio's CRDs of the kinds it watches into one directory",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			file, err := deploy.IstioCRDFile(".")
			if err != nil {
				return err
			}
			crds, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if err := deploy.Write(out, crds, opts); err != nil {
				return fmt.Errorf("writing %s: %w", out, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (CRDs of %v from %s) and the manifests into %s\n",
				deploy.CRDFile, deploy.ServedKinds(), file, out)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "build/deploy", "directory to write (its YAML files are replaced)")
	cmd.Flags().StringVar(&opts.Image, "image", deploy.DefaultImage, "discovery image the Deployment runs")
	return cmd
}
