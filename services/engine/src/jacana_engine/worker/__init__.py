"""Step execution: the model runner (one forward per step), batch metadata, host-to-device
staging, CUDA graphs for decode and prefill, decode overlap, row buckets and warm-up."""
