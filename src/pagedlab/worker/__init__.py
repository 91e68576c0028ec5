"""The worker: the model runner that builds each step's tensors, and the sampler (vllm/v1/worker, vllm/v1/sample)."""
