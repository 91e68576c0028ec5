"""pagedlab: vLLM's PagedAttention and continuous batching, one readable stage at a time.

Start with `pagedlab demo` (the CLI) or `from pagedlab import LLM, SamplingParams`.
"""

from pagedlab.config import EngineConfig
from pagedlab.engine.engine import LLMEngine
from pagedlab.llm import LLM
from pagedlab.model.loader import BUNDLED_MODEL, LoadedModel, load_model
from pagedlab.outputs import BeamSearchOutput, BeamSearchSequence, CompletionOutput, RequestOutput
from pagedlab.sampling_params import BeamSearchParams, SamplingParams

__all__ = [
    "BUNDLED_MODEL",
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "CompletionOutput",
    "EngineConfig",
    "LLM",
    "LLMEngine",
    "LoadedModel",
    "RequestOutput",
    "SamplingParams",
    "load_model",
]
__version__ = "0.1.0"
