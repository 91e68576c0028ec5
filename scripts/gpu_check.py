"""Maintainers: `make gpu-check`, everything in pagedlab that needs a GPU, in one run of under 8 minutes.

Run it where CUDA is: a lent GPU machine has torch, Triton and transformers but no network, so nothing is
installed and the package runs from src/. It prints a section per step, and writes what it measured under
--out (default gpu-check/):

    1. device       the GPU, its memory, torch and Triton, the peak bandwidth the kernel bench divides by
    2. gpu tests    every test marked gpu (the kernels at serving sizes), with PAGEDLAB_REQUIRE_GPU=1: a test
                    that skips fails                                                       -> gpu-tests.txt
    3. bench kernel decode V1 and V2 and the prefill kernel against the torch path and SDPA: latency, GB/s and
                    the share of the device's peak (the goal: decode at 70 % or more)    -> kernel.json
    4. bench real   every system on the GPU (`--device cuda`), bfloat16, at KV budgets that bind on a GPU, then
                    the step profile                                                       -> real.json
                    The model has SmolLM2-135M's shape with random weights: its 538 MB of weights cannot travel
                    to a machine without a network, and a step's time does not depend on the weights' values
                    (every system does the same work: answer lengths are enforced).

Each step has its own time limit; one that fails is reported and the next runs. The exit status is that of
the worst step. `--dry-run` runs the same steps on the CPU at toy sizes (a 2-layer model of the same family,
the kernels under Triton's interpreter), which is how tests/scripts/test_gpu_check.py checks this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_SHAPE = {  # SmolLM2-135M-Instruct's config.json (what `pagedlab fetch smollm2` writes), weights aside
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000.0,
    "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
TOY_SHAPE = SMOLLM2_SHAPE | {  # two small layers of the same family, for --dry-run
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
}  # fmt: skip
MIB = 2**20
GPU_REAL = {"num_requests": 48, "kv_budgets": (32 * MIB, 128 * MIB, 512 * MIB), "dtypes": ("bfloat16",),
            "repeats": 1, "profile_batches": (8, 32, 128), "device": "cuda"}  # fmt: skip
DRY_REAL = {
    "num_requests": 4, "kv_budgets": (256 * 1024,), "dtypes": ("float32",), "repeats": 1, "profile_batches": (2,),
    "profile_steps": 2, "output_cap": 6, "length_scale": 0.05, "device": "cpu",
}  # fmt: skip
LIMITS = {"gpu tests": 150, "bench kernel": 120, "bench real": 180}  # seconds per step: under 8 minutes in all


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="where the results go")
    parser.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at toy sizes")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))  # pagedlab from this checkout: nothing is installed on a lent machine
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env |= {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"} | ({} if args.dry_run else {"PAGEDLAB_REQUIRE_GPU": "1"})
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
    codes = [device_step(args.dry_run)]
    codes.append(run_step("gpu tests", gpu_tests_command(args.dry_run), env, args.out / "gpu-tests.txt"))
    kernel = [sys.executable, "-m", "pagedlab", "bench", "kernel", "--json"]
    codes.append(run_step("bench kernel", kernel, env, args.out / "kernel.json", json_out=True))
    model = shape_twin(args.out / "model", TOY_SHAPE if args.dry_run else SMOLLM2_SHAPE)
    real = [
        sys.executable,
        str(Path(__file__)),
        "--real",
        str(model),
        json.dumps(DRY_REAL if args.dry_run else GPU_REAL),
    ]
    codes.append(run_step("bench real", real, env, args.out / "real.json", json_out=True))
    print(f"\ngpu-check: {sum(c == 0 for c in codes)} of {len(codes)} steps passed; results in {args.out}/")
    return max(codes)


def device_step(dry_run: bool) -> int:
    import torch

    print("== device")
    if not torch.cuda.is_available():
        print("no CUDA device" + (" (a dry run: the CPU stands in)" if dry_run else ": gpu-check needs a GPU"))
        return 0 if dry_run else 2
    import triton

    from pagedlab.bench.kernel import peak_gbps_for

    name, props = torch.cuda.get_device_name(), torch.cuda.get_device_properties(0)
    memory, peak = props.total_memory / 2**30, peak_gbps_for(name) or "unknown"
    versions = f"torch {torch.__version__}, triton {triton.__version__}"
    print(f"{name}, {memory:.0f} GiB, {props.multi_processor_count} SMs; {versions}; peak {peak} GB/s (PEAK_GBPS)")
    return 0


def gpu_tests_command(dry_run: bool) -> list[str]:
    tests = ["tests/attention/test_triton_kernels_gpu.py", "tests/bench/test_kernel_gpu.py"]
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *tests] + (
        ["--collect-only"] if dry_run else []  # a CPU can only check that they are there
    )


def run_step(name: str, command: list[str], env: dict, out: Path, json_out: bool = False) -> int:
    """Run one step with its time limit, its output to the terminal and to `out` (stdout only, for JSON)."""
    print(f"\n== {name}", flush=True)
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, timeout=LIMITS[name], text=True,
                              stdout=subprocess.PIPE, stderr=None if json_out else subprocess.STDOUT)  # fmt: skip
    except subprocess.TimeoutExpired:
        print(f"{name}: stopped at its limit of {LIMITS[name]} s")
        return 124
    out.write_text(done.stdout)
    if not json_out:
        print(done.stdout, end="")
    print(f"{name}: exit {done.returncode} in {time.monotonic() - start:.0f} s -> {out}")
    return done.returncode


def shape_twin(folder: Path, config: dict) -> Path:
    """A Hugging Face folder of a Llama with this config and seeded random weights (N(0, 0.02), transformers'
    own init), the bundled tokenizer (its ids are a few of the vocabulary's; the prompts need no other)."""
    import torch
    import transformers

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(ROOT / "src" / "pagedlab" / "data" / "tiny-shakespeare" / "tokenizer.json", folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}))
    return folder


def real_in_process(model: str, options: str) -> int:
    """`pagedlab bench real` on `model` with these options (JSON), tables on stderr and one JSON object on stdout."""
    from pagedlab.bench import run_bench

    opts = json.loads(options)
    opts = {k: tuple(v) if isinstance(v, list) else v for k, v in opts.items()}
    run_bench("real", as_json=True, figure=False, model=model, **opts)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--real":  # step 4, in its own process (PYTHONPATH holds src/)
        sys.exit(real_in_process(sys.argv[2], sys.argv[3]))
    sys.exit(main())
