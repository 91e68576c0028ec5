"""Foundation: `pagedlab train-tiny`, the seeded recipe behind the bundled `tiny-shakespeare` model.

Builds on: model/llama.py, model/tokenizer.py.
Read with: README.md ("The bundled model").

A character-level Llama (GQA, tied embeddings) trained on tinyshakespeare.txt
(public domain). Every speech (a paragraph between blank lines) becomes
`<bos> speech <eos>`, so the model learns to end its own speeches and
sampled outputs stop by themselves with varied lengths. The result is saved in
Hugging Face format (config.json, model.safetensors, tokenizer.json), so the
bundled model is loaded by exactly the code that loads any checkpoint.

Shapes: B sequences per batch, L tokens each, E hidden size, V vocab.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm

from pagedlab.model.config import ModelConfig
from pagedlab.model.llama import CausalLM
from pagedlab.model.loader import corpus_path
from pagedlab.model.tokenizer import build_char_tokenizer


@dataclass(frozen=True)
class TrainConfig:
    """The recipe; `pagedlab train-tiny` with no flags reproduces the bundled model."""

    seed: int = 1337  # seeds torch and the batch sampler
    steps: int = 1000  # optimizer steps
    batch_size: int = 32  # B
    seq_len: int = 128  # L, training context (RoPE lets the model run past it)
    lr: float = 3e-3  # peak AdamW learning rate (cosine decay to lr / 10)
    warmup: int = 100  # linear warm-up steps
    hidden_size: int = 128  # E
    num_layers: int = 4
    num_heads: int = 4  # H; head_dim = 32
    num_kv_heads: int = 2  # KVH: grouped-query attention, two query heads per KV head
    max_position_embeddings: int = 1024  # the engine's default max_model_len
    val_fraction: float = 0.1  # the last 10% of speeches are held out
    eval_batches: int = 20  # validation batches per evaluation


class _TrainingAttention:
    """Batched causal attention for training: metadata is (B, L) of the flattened [B*L] tokens."""

    name = "training"

    def __init__(self, num_queries_per_kv: int):
        self.rep = num_queries_per_kv

    def forward(self, layer_idx, q, k, v, metadata):
        b, seq = metadata
        q = q.view(b, seq, *q.shape[1:]).transpose(1, 2)  # [B*L, H, D] -> [B, H, L, D]
        k = k.repeat_interleave(self.rep, dim=1).view(b, seq, *q.shape[1:2], -1).transpose(1, 2)
        v = v.repeat_interleave(self.rep, dim=1).view(b, seq, *q.shape[1:2], -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, L, D]
        return out.transpose(1, 2).reshape(b * seq, *out.shape[1:2], -1)  # -> [B*L, H, D]


def speeches(text: str) -> list[str]:
    """Paragraphs split on blank lines: 'ROMEO:\\nline\\nline'."""
    return [p.strip("\n") for p in text.split("\n\n") if p.strip()]


def model_config(tc: TrainConfig, vocab_size: int) -> dict:
    """The config.json of the trained model, in Hugging Face's Llama format."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": tc.hidden_size,
        "intermediate_size": 3 * tc.hidden_size,
        "num_hidden_layers": tc.num_layers,
        "num_attention_heads": tc.num_heads,
        "num_key_value_heads": tc.num_kv_heads,
        "head_dim": tc.hidden_size // tc.num_heads,
        "max_position_embeddings": tc.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "float32",
    }


def _batches(stream: torch.Tensor, tc: TrainConfig, generator: torch.Generator):
    """Random windows of the token stream: inputs and next-token targets, both [B, L]."""
    while True:
        starts = torch.randint(0, len(stream) - tc.seq_len - 1, (tc.batch_size,), generator=generator)
        window = torch.stack([stream[s : s + tc.seq_len + 1] for s in starts.tolist()])  # [B, L+1]
        yield window[:, :-1], window[:, 1:]


def _loss(model: CausalLM, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    b, seq = x.shape
    positions = torch.arange(seq).repeat(b)  # [B*L]
    attn = _TrainingAttention(model.config.num_queries_per_kv)
    hidden = model(x.reshape(-1), positions, attn, (b, seq))  # [B*L, E]
    return F.cross_entropy(model.compute_logits(hidden), y.reshape(-1))


@torch.no_grad()
def _evaluate(model: CausalLM, stream: torch.Tensor, tc: TrainConfig) -> float:
    gen = torch.Generator().manual_seed(tc.seed + 1)  # the same validation windows every time
    batches = _batches(stream, tc, gen)
    return sum(float(_loss(model, *next(batches))) for _ in range(tc.eval_batches)) / tc.eval_batches


def _init_weights(model: CausalLM, std: float = 0.02) -> None:
    """GPT-2 / Hugging Face initialisation: N(0, 0.02) weights, zero biases (norms stay at 1)."""
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=std)
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)


def _lr(step: int, tc: TrainConfig) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    progress = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_tiny(out_dir: str | Path, tc: TrainConfig = TrainConfig()) -> dict:
    """Train the bundled model and write it to `out_dir`; returns the training summary."""
    torch.manual_seed(tc.seed)
    texts = speeches(corpus_path().read_text())
    tokenizer = build_char_tokenizer(sorted(set("".join(texts))))
    encoded = [tokenizer.encode(t) + [1] for t in texts]  # encode() adds <bos>; append <eos>
    n_val = int(len(encoded) * tc.val_fraction)
    train = torch.tensor([t for s in encoded[:-n_val] for t in s])
    val = torch.tensor([t for s in encoded[-n_val:] for t in s])
    cfg_dict = model_config(tc, tokenizer.vocab_size)
    model = CausalLM(ModelConfig.from_dict(cfg_dict))
    _init_weights(model)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=0.1, betas=(0.9, 0.95))
    batches = _batches(train, tc, torch.Generator().manual_seed(tc.seed))
    start = time.perf_counter()
    for step in (bar := tqdm(range(tc.steps), desc="train-tiny")):
        for group in opt.param_groups:
            group["lr"] = _lr(step, tc)
        loss = _loss(model, *next(batches))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % 250 == 0 or step + 1 == tc.steps:
            tqdm.write(
                f"step {step + 1}: train loss {loss.item():.3f}, val loss {_evaluate(model.eval(), val, tc):.3f}"
            )
            model.train()
    summary = {
        "val_loss": round(_evaluate(model.eval(), val, tc), 4),
        "train_seconds": round(time.perf_counter() - start, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "recipe": tc.__dict__,
    }
    _save(model, cfg_dict, tokenizer, Path(out_dir), summary)
    return summary


def _save(model: CausalLM, cfg_dict: dict, tokenizer, out: Path, summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    tokenizer.save(out / "tokenizer.json")
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
