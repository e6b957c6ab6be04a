module github.com/wasmesh/wasmesh/filters

go 1.26

require (
	github.com/stretchr/testify v1.12.1
	github.com/tetratelabs/proxy-wasm-go-sdk v0.24.0
)

require (
	github.com/tetratelabs/wazero v1.12.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.44.0 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)

require github.com/wasmesh/wasmesh/wasm v0.0.0

replace github.com/wasmesh/wasmesh/wasm => ../wasm
