module koord-gpuquota/bench/go-reference

go 1.26
