package kubenode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// An Image is what a container image stands for on this machine: its entrypoint and
// default command (the image config's ENTRYPOINT and CMD), and the programs it holds,
// each one a local binary.
type Image struct {
	Entrypoint, Cmd []string
	// Programs maps a program's name in the image (the base name a command, probe or hook
	// runs it by, e.g. "pilot-agent") to a file: a name in the node's bin directory or an
	// absolute path. A command naming no program of its image runs the machine's own
	// program of that name (from PATH), as if every image were built on a full distribution.
	Programs map[string]string
}

// DefaultImages is the image table: an image's name without registry, tag or digest
// ("docker.io/istio/proxyv2:1.24" is "istio/proxyv2") to what it runs. Options.Images adds
// to it and overrides it.
//
//	wasmesh/echo                                   echo        (the sample application)
//	wasmesh/agent, wasmesh/proxyv2, istio/proxyv2  agent       (entrypoint pilot-agent; also meshproxy)
//	istio-release/proxyv2                          agent
//	wasmesh/discovery, istio/pilot                 discovery   (entrypoint pilot-discovery)
//	wasmesh/meshproxy                              meshproxy
//	busybox, alpine                                the machine's sh (CMD sh): commands from PATH
func DefaultImages() map[string]Image {
	agent := Image{Entrypoint: []string{"/usr/local/bin/pilot-agent"},
		Programs: map[string]string{"pilot-agent": "agent", "agent": "agent", "meshproxy": "meshproxy"}}
	discovery := Image{Entrypoint: []string{"/usr/local/bin/pilot-discovery"},
		Programs: map[string]string{"pilot-discovery": "discovery", "discovery": "discovery"}}
	shell := Image{Cmd: []string{"sh"}}
	return map[string]Image{
		"wasmesh/echo":          {Entrypoint: []string{"echo"}, Programs: map[string]string{"echo": "echo"}},
		"wasmesh/agent":         agent,
		"wasmesh/proxyv2":       agent,
		"istio/proxyv2":         agent,
		"istio-release/proxyv2": agent,
		"wasmesh/discovery":     discovery,
		"istio/pilot":           discovery,
		"wasmesh/meshproxy":     {Entrypoint: []string{"meshproxy"}, Programs: map[string]string{"meshproxy": "meshproxy"}},
		"busybox":               shell,
		"alpine":                shell,
	}
}

// ImageName is an image reference without its registry, tag and digest, and without
// Docker Hub's "library/" prefix: the key of the image table.
func ImageName(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	if first, rest, ok := strings.Cut(ref, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		ref = rest
	}
	return strings.TrimPrefix(ref, "library/")
}

// imageError is a container's image that cannot run here: kubelet's ErrImagePull.
type imageError struct{ msg string }

func (e *imageError) Error() string { return e.msg }

// lookupImage finds ref in the table.
func (n *Node) lookupImage(ref string) (Image, error) {
	img, ok := n.images[ImageName(ref)]
	if !ok {
		known := make([]string, 0, len(n.images))
		for k := range n.images {
			known = append(known, k)
		}
		sort.Strings(known)
		return Image{}, &imageError{fmt.Sprintf("kubenode: image %q (%s) is not in the image table; known: %s (see testenv/kubenode/README.md)",
			ref, ImageName(ref), strings.Join(known, ", "))}
	}
	return img, nil
}

// program resolves argv0 of a command run in a container of img to a local executable: a
// program of the image, an absolute path that exists, or a program on PATH.
func (n *Node) program(img Image, argv0 string) (string, error) {
	if file, ok := img.Programs[filepath.Base(argv0)]; ok {
		if !filepath.IsAbs(file) {
			file = filepath.Join(n.opts.BinDir, file)
		}
		if _, err := os.Stat(file); err != nil {
			return "", &imageError{fmt.Sprintf("kubenode: %s (program %s of the image) is missing: %v (run `make build` or set WASMESH_BIN_DIR)", file, argv0, err)}
		}
		return file, nil
	}
	if filepath.IsAbs(argv0) {
		if _, err := os.Stat(argv0); err == nil {
			return argv0, nil
		}
	}
	p, err := exec.LookPath(filepath.Base(argv0))
	if err != nil {
		return "", fmt.Errorf("exec: %q: executable file not found in $PATH", argv0)
	}
	return p, nil
}

// commandLine is the container's command line as a container runtime builds it: the
// container's command replaces the entrypoint (and drops the image's CMD); its args replace
// the CMD.
func commandLine(img Image, command, args []string) []string {
	var argv []string
	if len(command) > 0 {
		argv = append(argv, command...)
	} else {
		argv = append(argv, img.Entrypoint...)
	}
	if len(args) > 0 {
		argv = append(argv, args...)
	} else if len(command) == 0 {
		argv = append(argv, img.Cmd...)
	}
	return argv
}
