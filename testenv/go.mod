module github.com/wasmesh/wasmesh/testenv

go 1.26
