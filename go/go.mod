module example.invalid/engine-state/go

go 1.19
