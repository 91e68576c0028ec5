"""The engine: one step (schedule -> execute -> update), request intake and checks, outputs, stats (vllm/v1/engine)."""
