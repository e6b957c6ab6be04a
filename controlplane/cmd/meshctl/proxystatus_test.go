package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cobra's completion: the script, and the subcommands it completes.
func TestCompletion(t *testing.T) {
	out, _, err := run(t, "", "completion", "bash")
	require.NoError(t, err)
	assert.Contains(t, out, "__start_meshctl")
	out, _, err = run(t, "", "__complete", "proxy-config", "")
	require.NoError(t, err)
	for _, sub := range []string{"bootstrap", "clusters", "endpoints", "listeners", "routes", "secrets"} {
		assert.Contains(t, out, sub+"\t")
	}
	out, _, err = run(t, "", "__complete", "proxy-")
	require.NoError(t, err)
	assert.Contains(t, out, "proxy-status\t")
	assert.Contains(t, out, "proxy-config\t")
}

// Bad input is refused naming what is wrong, before anything is fetched.
func TestProxyCommandsRefuseBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"proxy-status", "-o", "xml"}, `--output "xml": want one of table, json, yaml`},
		{[]string{"proxy-config", "clusters"}, "name a pod (<name>[.<namespace>]) or give --admin"},
		{[]string{"proxy-config", "clusters", "--admin", "http://127.0.0.1:1", "--direction", "up"}, `--direction "up": want inbound or outbound`},
		{[]string{"proxy-config", "routes", "web", "-o", "csv"}, `--output "csv": want one of table, json, yaml`},
		{[]string{"proxy-status", "a", "b"}, "accepts at most 1 arg(s), received 2"},
	} {
		_, _, err := run(t, "", c.args...)
		require.Error(t, err, c.args)
		assert.Contains(t, err.Error(), c.want, c.args)
	}
}
