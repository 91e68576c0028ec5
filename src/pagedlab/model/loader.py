"""Foundation: load a Hugging Face-format folder (config.json + *.safetensors [+ tokenizer.json]).

Builds on: model/config.py, model/llama.py, model/tokenizer.py.
Read with: chapters/00-overview.md.

The bundled `tiny-shakespeare` model is such a folder shipped as package
data, so it takes exactly the path any downloaded checkpoint takes. Weights are
read with safetensors only: `torch.load` unpickles, and unpickling an
untrusted file runs its code. Every file is opened through model/files.py,
which refuses names that resolve outside the folder or are not regular files.
Every way a folder can be wrong (missing file, missing or misshapen tensor,
unknown tensor) is a ValueError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from safetensors import safe_open

from pagedlab.model.config import ModelConfig
from pagedlab.model.files import model_file, read_model_json
from pagedlab.model.llama import CausalLM
from pagedlab.model.memory import check_memory
from pagedlab.model.registry import SOURCES, resolve_named
from pagedlab.model.tokenizer import Tokenizer

BUNDLED_MODEL = "tiny-shakespeare"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class LoadedModel:
    """What `load_model` returns: the module, its config and (when the folder has one) its tokenizer."""

    model: CausalLM  # in eval mode, on the requested device and dtype
    config: ModelConfig  # parsed config.json
    tokenizer: Tokenizer | None  # None: only token-id prompts work
    path: Path  # the folder it came from


def bundled_model_path() -> Path:
    return Path(str(resources.files("pagedlab") / "data" / BUNDLED_MODEL))


def corpus_path() -> Path:
    """tinyshakespeare.txt, the bundled model's training text (public domain), which the benches sample."""
    return Path(str(resources.files("pagedlab") / "data" / "tinyshakespeare.txt"))


def resolve_model_path(model: str | Path) -> Path:
    if not isinstance(model, (str, Path)) or not str(model):
        raise ValueError(f"model: expected {BUNDLED_MODEL!r} or the path of a Hugging Face folder, got {model!r}")
    if str(model) == BUNDLED_MODEL:
        return bundled_model_path()
    named = resolve_named(str(model))  # "smollm2-135m-instruct" once fetched (model/registry.py)
    if named is not None:
        return named
    path = Path(model)
    if not path.is_dir():
        others = ", ".join(repr(n) for n in SOURCES)
        raise ValueError(f"model: {str(model)!r} is neither {BUNDLED_MODEL!r}, {others} nor a folder")
    return path


def load_model_config(model: str | Path = BUNDLED_MODEL) -> tuple[Path, ModelConfig]:
    """The folder and its parsed config.json (with generation_config.json's EOS ids): cheap, no weights read."""
    path = resolve_model_path(model)
    cfg = ModelConfig.from_file(path / "config.json")
    return path, _with_generation_eos(cfg, path)


def load_model(
    model: str | Path = BUNDLED_MODEL, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> LoadedModel:
    path, cfg = load_model_config(model)
    check_memory({"config.json": (cfg.num_parameters * dtype.itemsize, "the weights")}, device)
    module = CausalLM(cfg)
    # strict=False: a tied LM head has no tensor of its own; names were checked by _read_weights
    module.load_state_dict(_read_weights(path, module), strict=False)
    module = module.to(device=device, dtype=dtype).eval()
    module.requires_grad_(False)
    tok_file = model_file(path, "tokenizer.json", "tokenizer file", required=False)
    tokenizer = Tokenizer.from_folder(path) if tok_file is not None else None
    if tokenizer is not None and tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"{tok_file}: {tokenizer.vocab_size} tokens but config.json field 'vocab_size' is {cfg.vocab_size}"
        )
    return LoadedModel(module, cfg, tokenizer, path)


def _read_weights(path: Path, module: CausalLM) -> dict[str, torch.Tensor]:
    """Read every expected tensor from the folder's safetensors files, checking names and shapes."""
    expected = {k: v.shape for k, v in module.state_dict().items()}
    if module.config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    weights: dict[str, torch.Tensor] = {}
    for file, names in _weight_files(path).items():
        weights |= _read_file(file, names, expected, module.config.architecture)
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ValueError(
            f"{path}: tensor '{missing[0]}' is missing from the safetensors files ({len(missing)} missing)"
        )
    return weights


def _read_file(file: Path, names: list[str] | None, expected: dict, architecture: str) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file (those `names`, or all); an unreadable file names itself."""
    try:
        with safe_open(str(file), framework="pt") as f:
            return {
                name: _read_tensor(f, file, name, expected, architecture)
                for name in names or f.keys()
                if not name.endswith(_IGNORED_SUFFIXES) and (name != "lm_head.weight" or name in expected)
            }
    except ValueError:
        raise
    except Exception as e:  # safetensors raises its own SafetensorError (a bare Exception), or OSError
        raise ValueError(f"{file}: not a readable safetensors file ({e})") from None


def _read_tensor(f, file: Path, name: str, expected: dict, architecture: str) -> torch.Tensor:
    if name not in expected:
        raise ValueError(f"{file.name}: unexpected tensor '{name}' for {architecture}")
    if name not in f.keys():
        raise ValueError(f"{file.name}: tensor '{name}' listed in the index is missing")
    tensor = f.get_tensor(name)
    if tuple(tensor.shape) != tuple(expected[name]):
        raise ValueError(
            f"{file.name}: tensor '{name}' has shape {tuple(tensor.shape)}, config.json implies {tuple(expected[name])}"
        )
    return tensor


def _weight_files(path: Path) -> dict[Path, list[str] | None]:
    """{file: tensor names to read (None = all)}, from model.safetensors or a sharded index."""
    index = model_file(path, "model.safetensors.index.json", "JSON file", required=False)
    if index is not None:
        return _shards(path, index)
    single = model_file(path, "model.safetensors", "safetensors file", required=False)
    if single is not None:
        return {single: None}
    found = sorted(p.name for p in path.glob("*.safetensors"))
    if len(found) == 1:
        return {model_file(path, found[0], "safetensors file"): None}
    if found:
        raise ValueError(f"{path}: several safetensors files but no model.safetensors.index.json")
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise ValueError(f"{path}: only pickle checkpoints (*.bin/*.pt) found; pagedlab reads safetensors only")
    raise ValueError(f"{path}: model.safetensors is missing")


def _shards(path: Path, index: Path) -> dict[Path, list[str]]:
    """The index's weight_map, {tensor name: shard file name}, grouped by shard; every shard inside the folder."""
    weight_map = read_model_json(path, index.name).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index}: field 'weight_map' must be an object of tensor name -> shard file name")
    files: dict[Path, list[str]] = {}
    for name, shard in weight_map.items():
        files.setdefault(_shard_path(path, index, shard), []).append(name)
    return files


def _shard_path(path: Path, index: Path, shard: str) -> Path:
    """A shard named by the index: a file of this folder, never an absolute path or one that climbs out."""
    if Path(shard).is_absolute() or ".." in Path(shard).parts:
        raise ValueError(f"{index}: shard '{shard}' named in 'weight_map' is outside the model folder")
    file = path / shard
    if not file.exists():
        raise ValueError(f"{index}: shard '{shard}' named in 'weight_map' is missing")
    return model_file(path, shard, "safetensors file")  # a symlink out of the folder, a FIFO: refused there


def _with_generation_eos(cfg: ModelConfig, path: Path) -> ModelConfig:
    """generation_config.json may list more EOS ids than config.json (Llama 3 does)."""
    gen = read_model_json(path, "generation_config.json", required=False)
    if gen is None:
        return cfg
    extra = ModelConfig.token_ids_field(gen, "eos_token_id", str(path / "generation_config.json"))
    merged = tuple(dict.fromkeys(cfg.eos_token_ids + extra))
    return dataclasses.replace(cfg, eos_token_ids=merged).check_token_ids(str(path / "generation_config.json"))
