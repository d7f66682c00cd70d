"""Start-up tuners of the decode GEMMs (cuBLAS vs the skinny Triton kernel), the in-graph
search, their on-disk cache and the GPU timer they share."""
