module github.com/wasmesh/wasmesh/filters

go 1.26

require (
	github.com/stretchr/testify v1.12.1
	github.com/tetratelabs/proxy-wasm-go-sdk v0.24.0
)

require (
	github.com/tetratelabs/wazero v1.7.2 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
