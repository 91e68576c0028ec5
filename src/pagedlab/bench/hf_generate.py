"""Benchmarks: the `hf-generate` baseline of `pagedlab bench throughput`, Hugging Face `generate` on static batches.

Builds on: bench/throughput.py (the stream and what a system reports of it), Hugging Face transformers
(optional: the baseline runs only when it is installed).
Read with: chapters/97-architecture.md (Benchmarks), chapters/05-continuous-batching.md.

The bundled model is loaded as transformers' LlamaForCausalLM and serves the
stream in batches of max_num_seqs, in stream order, each left-padded to its
longest prompt and run until its longest output ends (EOS ignored):

    batch   | . . P P P | o o o o o o |      P prompt, . left padding,
            | P P P P P | o o o x x x |      o a request's own output tokens,
            | . P P P P | o o o o x x |      x generated only because the batch runs on

Its own KV cache is contiguous per row, so its decode reads every row's padded
context: the `decode_context` it reports counts those slots.
"""

from __future__ import annotations

import functools
import os
import time

from pagedlab.bench.throughput import Served, StreamRequest
from pagedlab.errors import check


def hf_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def load_hf_model():
    """The bundled model as Hugging Face's LlamaForCausalLM (float32, eval), offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaForCausalLM

    from pagedlab.model.loader import bundled_model_path

    return LlamaForCausalLM.from_pretrained(bundled_model_path()).float().eval()


def hf_job(stream: list[StreamRequest], batch_size: int):
    """serve_hf on the whole stream as a call of no arguments (model loaded, warmed up); None without transformers."""
    if not hf_available():
        return None
    model = load_hf_model()
    serve_hf(model, stream[:2], 2)  # torch's first calls
    return functools.partial(serve_hf, model, stream, batch_size)


def serve_hf(model, stream: list[StreamRequest], batch_size: int) -> Served:
    """Static padded batches of `batch_size`, in stream order; each runs until the batch's longest output ends.

    A request's first token and finish are the ends of its batch's first and output_len-th generate steps.
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    tokens, first, latency, steps, context = [], [], [], 0, 0
    for i in range(0, len(stream), batch_size):
        batch = stream[i : i + batch_size]
        new, step_times = _generate_batch(model, batch)
        width, n = max(len(r.prompt_token_ids) for r in batch), len(step_times)
        context += len(batch) * ((n - 1) * width + (n - 1) * n // 2)  # every row, padded, until the longest ends
        for row, r in enumerate(batch):
            tokens.append(new[row, : r.output_len].tolist())  # its own output; the rest of the row is the batch's
            first.append(step_times[0] - start)
            latency.append(step_times[r.output_len - 1] - start)
        steps += len(step_times)
    total_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    return Served(tokens, first, latency, total_s, cpu_s, steps, None, None, None, context)


def _generate_batch(model, batch: list[StreamRequest]):
    """Greedy `generate` on one left-padded batch, past EOS: (new token ids [B, N], the end time of each step)."""
    num_new = max(r.output_len for r in batch)
    new, times = generate_padded(model, [r.prompt_token_ids for r in batch], num_new)  # eos None: as ignore_eos
    check(new.shape[1] == num_new, "generate stopped early")
    return new, times


def generate_padded(model, prompts: list[list[int]], max_new_tokens: int, eos_token_id=None, pad_token_id: int = 0):
    """Greedy `generate` on one left-padded batch: (new token ids [B, N], the end time of each of the N steps).

    eos_token_id None runs every row the full length; a pad of 0 under mask 0 is never read, whatever its id.
    Shared by the throughput bench (hf-generate) and the real-model bench.
    """
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StepClock(StoppingCriteria):
        """Never stops generation (EOS or the length does); notes when each step ends."""

        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    width = max(len(p) for p in prompts)
    pad = [width - len(p) for p in prompts]
    ids = torch.tensor([[pad_token_id] * n + list(p) for n, p in zip(pad, prompts)])  # [B, P]
    mask = torch.tensor([[0] * n + [1] * (width - n) for n in pad])  # [B, P]: 0 = padding, never a prompt's EOS
    clock = StepClock()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            stopping_criteria=StoppingCriteriaList([clock]),
        )
    check(out.shape[1] == width + len(clock.times), "generate: a step without its clock")
    return out[:, width:], clock.times
