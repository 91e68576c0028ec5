# pagedlab: `make setup` once, then `make demo`, `make test`, `make test-fast`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup demo generate test test-fast lint figures train-tiny strip-notebooks clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

setup: $(PY)  ## CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0 || $(PIP) install -q "torch>=2.4"
	$(PIP) install -q -e ".[dev]"

generate: setup
	$(VENV)/bin/pagedlab generate "ROMEO:" --max-tokens 200

demo: setup  ## the main job: a live view of the engine, then the summary and the figures
	$(VENV)/bin/pagedlab demo

test: setup  ## one torch thread: tiny models run faster, and parallel workers do not oversubscribe
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests notebooks --nbmake

test-fast: setup
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests -m "not slow"

lint: setup
	$(VENV)/bin/ruff check src tests

train-tiny: setup
	$(VENV)/bin/pagedlab train-tiny

strip-notebooks:
	$(PY) -m nbstripout notebooks/*.ipynb

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
