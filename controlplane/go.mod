module github.com/wasmesh/wasmesh/controlplane

go 1.26
