# Two commands on a fresh machine: `make run` and `make test`. Each builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The stamp depends on pyproject.toml, so editing dependencies refreshes the venv.
STAMP := $(VENV)/.kvref-installed

.PHONY: run test typecheck audit pytest bench clean redis-server

# Set-up takes a minute or two on a fresh machine: each step says what it does, and pip shows
# what it collects and installs (no -q), so a slow step is never silent.
PIP := $(BIN)/python -m pip --disable-pip-version-check

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> installing torch 2.13.0 (the CPU build on this machine's disk; an unpinned torch pulls a multi-GB CUDA build)"
	$(PIP) install --progress-bar off torch==2.13.0
	@echo "==> installing kvref in editable mode with its torch, dev and redis extras"
	$(PIP) install --progress-bar off -e '.[torch,dev,redis]'
	touch $(STAMP)
	@echo "==> $(VENV) is ready"

# The Redis tier's tests start their own servers; Debian's package provides redis-server.
redis-server:
	@command -v redis-server >/dev/null || (echo "==> installing Debian's redis-server (tests start their own servers)" && apt-get update && apt-get install -y redis-server)

run: $(STAMP)
	$(BIN)/kvref demo
	# The example engine carries deliberate findings: show their fixes as a diff. Exit 1 means
	# "fixes would apply" (expected here); anything else (2: an error) fails the run.
	$(BIN)/kvref audit examples/engine --diff --unsafe-fixes; test $$? -eq 1

typecheck: $(STAMP)
	@echo "==> pyright (strict)"
	$(BIN)/pyright

audit: $(STAMP)
	@echo "==> kvref audit kvref"
	$(BIN)/kvref audit kvref

pytest: $(STAMP) redis-server
	@echo "==> pytest"
	$(BIN)/python -m pytest -q

test: typecheck audit pytest

bench: $(STAMP)
	$(BIN)/python tools/bench_manager.py
	$(BIN)/python tools/bench_tiering.py
	$(BIN)/python tools/bench_transfer.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
