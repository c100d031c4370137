# Two entry points for a fresh machine: `make app` and `make test`.
# Both create .venv and install what they need (idempotent: a stamp file per requirements set).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet -c constraints.txt

.PHONY: app test bench venv clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.stamp-runtime: requirements.txt constraints.txt | $(BIN)/python
	$(PIP) -r requirements.txt
	$(PIP) -e . --no-deps
	touch $@

$(VENV)/.stamp-dev: requirements-dev.txt $(VENV)/.stamp-runtime
	$(PIP) -r requirements-dev.txt
	touch $@

venv: $(VENV)/.stamp-runtime

app: $(VENV)/.stamp-runtime
	$(BIN)/streamlit run app.py --server.headless true --server.address 127.0.0.1 --browser.gatherUsageStats false

test: $(VENV)/.stamp-dev
	$(BIN)/python -m pytest -q tests

bench: $(VENV)/.stamp-dev
	$(BIN)/python bench/core_bench.py

clean:
	rm -rf $(VENV)
