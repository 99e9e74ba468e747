module koord-gpuquota/bench/loadgen

go 1.26
