"""Stage 6: the Triton kernels (store-by-slot, paged decode V1/V2, paged prefill) and the backend that runs them."""
