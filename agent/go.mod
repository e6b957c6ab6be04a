module github.com/wasmesh/wasmesh/agent

go 1.26
