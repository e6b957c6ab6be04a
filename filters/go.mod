module github.com/wasmesh/wasmesh/filters

go 1.26

require (
	github.com/stretchr/testify v1.12.1 // indirect
	github.com/tetratelabs/proxy-wasm-go-sdk v0.24.0 // indirect
)
