module github.com/wasmesh/wasmesh/wasm

go 1.26

require (
	github.com/stretchr/testify v1.12.1 // indirect
	github.com/tetratelabs/wazero v1.12.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/sys v0.44.0 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)
