// Command filtertest runs YAML scenarios against proxy-wasm filters offline, on the same
// wazero host the mesh proxy uses, and exits non-zero when a case fails.
//
//	filtertest [-v] SCENARIO.yaml...
//
// Exit status: 0 when every case of every scenario passed, 1 when a case failed or a
// scenario could not run, 2 on bad usage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/wasm/filtertest"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// errFailed marks a run whose report already says what failed.
var errFailed = errors.New("some cases failed")

// usageError is a command line filtertest cannot run.
type usageError struct{ error }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var verbose bool
	cmd := &cobra.Command{
		Use:   "filtertest [-v] SCENARIO.yaml...",
		Short: "Run YAML scenarios against proxy-wasm filters offline",
		Long: "filtertest loads each scenario's .wasm on a proxy-wasm host (ABI 0.1.0 to 0.2.1),\n" +
			"sends its requests through the filter and checks the expected status, headers,\n" +
			"body, metrics and logs. The scenario format is described in wasmesh's README.",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{errors.New("no scenario file given")}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, files []string) error {
			ctx := context.Background()
			rt, err := host.NewRuntime(ctx, host.RuntimeConfig{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				return err
			}
			defer func() { _ = rt.Close(ctx) }()
			ok := true
			for _, f := range files {
				res := filtertest.RunFile(ctx, rt, f)
				res.Write(stdout, verbose)
				ok = ok && res.Passed()
			}
			if !ok {
				return errFailed
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print each case's filter logs and failures")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	err := cmd.Execute()
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errFailed):
		return 1
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "filtertest: %v\nusage: %s\n", err, cmd.Use)
		return 2
	default:
		fmt.Fprintf(stderr, "filtertest: %v\n", err)
		return 1
	}
}
