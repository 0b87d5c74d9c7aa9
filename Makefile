# Two commands on a fresh machine: `make run` and `make test`. Each builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The stamp depends on pyproject.toml, so editing dependencies refreshes the venv.
STAMP := $(VENV)/.kvref-installed

.PHONY: run test typecheck audit pytest bench clean redis-server

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch==2.13.0 is the CPU build on this machine's disk; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[torch,dev,redis]'
	touch $(STAMP)

# The Redis tier's tests start their own servers; Debian's package provides redis-server.
redis-server:
	@command -v redis-server >/dev/null || (echo "installing Debian's redis-server (tests start their own servers)" && apt-get update && apt-get install -y redis-server)

run: $(STAMP)
	$(BIN)/kvref demo
	# The example engine carries deliberate findings: show their fixes as a diff. Exit 1 means
	# "fixes would apply" (expected here); anything else (2: an error) fails the run.
	$(BIN)/kvref audit examples/engine --diff --unsafe-fixes; test $$? -eq 1

typecheck: $(STAMP)
	$(BIN)/pyright

audit: $(STAMP)
	$(BIN)/kvref audit kvref

pytest: $(STAMP) redis-server
	$(BIN)/python -m pytest -q

test: typecheck audit pytest

bench: $(STAMP)
	$(BIN)/python tools/bench_manager.py
	$(BIN)/python tools/bench_tiering.py
	$(BIN)/python tools/bench_transfer.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
