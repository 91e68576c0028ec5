"""Shared test set-up: offline Hugging Face, a deterministic hypothesis profile, tiny model builders."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from hypothesis import settings  # noqa: E402

# No hidden timing in tests: no deadline, and a fixed number of examples.
settings.register_profile("pagedlab", deadline=None, max_examples=60, derandomize=True, print_blob=True)
settings.load_profile("pagedlab")


import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="session")
def random_model():
    """A tiny random Llama built without transformers: 2 layers, GQA, 50 tokens, weights N(0, 0.25)."""
    from pagedlab.model.config import ModelConfig
    from pagedlab.model.llama import CausalLM

    cfg = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 50,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            "eos_token_id": 1,
        }
    )
    torch.manual_seed(0)
    model = CausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.25)
    return model.eval()
