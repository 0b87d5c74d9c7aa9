"""Drive kvref's and vLLM 0.33's CPU offloading managers through one trace and compare evictions.

vLLM's own manager and policies (`vllm/v1/kv_offload/{base,cpu/manager,cpu/policies/*}.py`) are
loaded from the published sdist, cached outside the repository by `tools/_audit_corpus.py`, by
path: each module is executed under its real name with light stand-ins injected into
`sys.modules` for what it imports and the manager does not use (vllm's logger, config, metrics
and kv-hints modules, and torch when it is not already imported). Afterwards `sys.modules` is
restored, so nothing of vLLM is importable by name and the stand-ins leak nowhere.

The trace is a prefix-sharing serving workload: requests pick one of a few shared prefixes by
Zipf popularity, share part of it and add unique blocks; several requests run at once. Each
request is replayed as vLLM's offloading connector drives the manager: `on_new_request` with the
key positions recorded, a maximal-prefix lookup, a load of the hits and a touch of every block,
then stores of its new blocks a few per step, completions of stores and loads some steps later,
and `on_request_finished` after its last store. Both managers get the same calls; every
`prepare_store` that evicts (or is refused) in either is compared.

Prints the share of such stores on which both evicted the same keys in the same order (and
refused the same stores), per policy.
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import importlib.util
import logging
import random
import sys
import types
from collections import deque
from collections.abc import Generator, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvref.base import LookupResult, OffloadKey, ReqContext, make_offload_key  # noqa: E402
from kvref.cpu.manager import CPUOffloadingManager  # noqa: E402
from tools._audit_corpus import fetch_corpus  # noqa: E402

__all__ = ["VLLM_SPEC", "VLLMKVOffload", "load_vllm_kv_offload", "TraceShape", "Comparison", "compare", "main"]

VLLM_SPEC = "vllm==0.33.0"

# Loaded in dependency order; each is executed from the sdist under its real module name.
_VLLM_MODULES = (
    "vllm.v1.metrics.cache_hit_source",
    "vllm.v1.kv_offload.base",
    "vllm.v1.kv_offload.cpu.common",
    "vllm.v1.kv_offload.cpu.policies.base",
    "vllm.v1.kv_offload.cpu.policies.lru",
    "vllm.v1.kv_offload.cpu.policies.arc",
    "vllm.v1.kv_offload.cpu.policies.factory",
    "vllm.v1.kv_offload.cpu.manager",
)
# Packages whose real __init__ would import most of vLLM: empty stand-ins.
_PACKAGES = (
    "vllm",
    "vllm.v1",
    "vllm.v1.metrics",
    "vllm.v1.kv_offload",
    "vllm.v1.kv_offload.cpu",
    "vllm.v1.kv_offload.cpu.policies",
    "vllm.utils",
    "vllm.distributed",
    "vllm.distributed.kv_transfer",
    "vllm.distributed.kv_transfer.kv_connector",
    "vllm.distributed.kv_transfer.kv_connector.v1",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading",
)


@dataclass(frozen=True)
class VLLMKVOffload:
    """The vLLM classes the comparison uses."""

    manager_class: Any
    req_context_class: Any
    lookup_result: Any


def _stub(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


class _Logger(logging.LoggerAdapter[logging.Logger]):
    def warning_once(self, msg: str, *args: object) -> None:
        self.warning(msg, *args)

    def info_once(self, msg: str, *args: object) -> None:
        self.info(msg, *args)


def _init_logger(name: str) -> _Logger:
    return _Logger(logging.getLogger(name), {})


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _int_array(values: Iterable[int], dtype: object = None) -> list[int]:
    return list(values)


def _stand_ins() -> dict[str, types.ModuleType]:
    class _Opaque:
        """Stands for a type the manager only names in annotations."""

    stand_ins = {name: _stub(name, __path__=[]) for name in _PACKAGES}
    stand_ins.update(
        {
            "vllm.logger": _stub("vllm.logger", init_logger=_init_logger),
            "vllm.v1.kv_hints": _stub("vllm.v1.kv_hints", KvHintsEnvelope=_Opaque),
            "vllm.v1.kv_offload.config": _stub("vllm.v1.kv_offload.config", OffloadingConfig=_Opaque),
            "vllm.utils.math_utils": _stub("vllm.utils.math_utils", cdiv=_cdiv),
            "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics": _stub(
                "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics",
                OffloadingConnectorStats=_Opaque,
            ),
        }
    )
    if "torch" not in sys.modules:
        # vLLM's base.py names torch.Tensor in a dataclass annotation, nothing more.
        stand_ins["torch"] = _stub("torch", Tensor=_Opaque)
    if "numpy" not in sys.modules:
        # Block ids go into np.array(ids, dtype=np.int32); a list compares the same way here.
        stand_ins["numpy"] = _stub("numpy", array=_int_array, int32="int32", ndarray=list)
    return stand_ins


def _borrowed(name: str) -> bool:
    return name in ("torch", "numpy") or name == "vllm" or name.startswith("vllm.")


@contextmanager
def _borrowed_modules(stand_ins: dict[str, types.ModuleType]) -> Generator[None]:
    saved = {name: module for name, module in sys.modules.items() if _borrowed(name)}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name in [name for name in sys.modules if _borrowed(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


def load_vllm_kv_offload(vllm_root: Path | None = None) -> VLLMKVOffload:
    """Execute vLLM's kv_offload CPU manager and policies from the sdist, stand-ins for the rest.

    Args:
        vllm_root: the unpacked sdist's root (the directory holding `vllm/`); default: fetch
            `VLLM_SPEC` into the cache (downloads once).

    Returns:
        vLLM's `CPUOffloadingManager`, `ReqContext` and `LookupResult`.
    """
    if vllm_root is None:
        vllm_root = fetch_corpus(VLLM_SPEC, log=False).root
    loaded: dict[str, types.ModuleType] = {}
    with _borrowed_modules(_stand_ins()):
        for name in _VLLM_MODULES:
            path = vllm_root.joinpath(*name.split(".")).with_suffix(".py")
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None, path
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            loaded[name] = module
    # The factory imports policies by module name when a manager is built: hand it the classes.
    factory: Any = loaded["vllm.v1.kv_offload.cpu.policies.factory"].CachePolicyFactory
    lru_class: Any = loaded["vllm.v1.kv_offload.cpu.policies.lru"].LRUCachePolicy
    arc_class: Any = loaded["vllm.v1.kv_offload.cpu.policies.arc"].ARCCachePolicy
    factory._registry["lru"] = lambda: lru_class
    factory._registry["arc"] = lambda: arc_class
    base: Any = loaded["vllm.v1.kv_offload.base"]
    return VLLMKVOffload(
        manager_class=loaded["vllm.v1.kv_offload.cpu.manager"].CPUOffloadingManager,
        req_context_class=base.ReqContext,
        lookup_result=base.LookupResult,
    )


@dataclass(frozen=True)
class TraceShape:
    """The synthetic workload.

    Attributes:
        num_blocks: CPU cache size, in blocks.
        num_requests: requests replayed.
        num_prefixes: shared prefixes (documents, system prompts), Zipf-popular.
        prefix_blocks: the longest shared prefix, in blocks (a request shares 1..this many).
        suffix_blocks: unique blocks per request (up to this many).
        num_groups: KV-cache groups (every block has one key per group).
        concurrency: requests running at once.
        blocks_per_step: blocks a request stores per step.
        lag: steps before a store or load completes.
        block_tokens: tokens per block (key positions are multiples of it).
        zipf: the popularity exponent.
        seed: the random seed.
    """

    num_blocks: int = 256
    num_requests: int = 600
    num_prefixes: int = 24
    prefix_blocks: int = 24
    suffix_blocks: int = 12
    num_groups: int = 2
    concurrency: int = 6
    blocks_per_step: int = 4
    lag: int = 2
    block_tokens: int = 16
    zipf: float = 1.1
    seed: int = 0


@dataclass
class Comparison:
    """How the two managers' stores compared on one trace."""

    policy: str
    stores: int = 0
    evicting_stores: int = 0
    agreeing_stores: int = 0
    first_disagreement: int | None = None

    @property
    def agreement(self) -> float:
        """The share of evicting (or refused) stores on which both did the same, 1.0 if none."""
        return self.agreeing_stores / self.evicting_stores if self.evicting_stores else 1.0


@dataclass
class _Request:
    index: int
    keys: list[list[OffloadKey]]  # per block, one key per group
    kvref_context: ReqContext
    vllm_context: Any
    hits: int = 0
    next_block: int = 0
    loaded: list[OffloadKey] = field(default_factory=lambda: [])


def _key(*parts: int) -> bytes:
    return hashlib.blake2b(b"".join(p.to_bytes(8, "big") for p in parts), digest_size=16).digest()


def _make_requests(shape: TraceShape) -> list[list[list[OffloadKey]]]:
    rng = random.Random(shape.seed)
    weights = [1.0 / (rank + 1) ** shape.zipf for rank in range(shape.num_prefixes)]
    requests: list[list[list[OffloadKey]]] = []
    for index in range(shape.num_requests):
        prefix = rng.choices(range(shape.num_prefixes), weights)[0]
        shared = rng.randint(1, shape.prefix_blocks)
        hashes = [_key(0, prefix, block) for block in range(shared)]
        hashes += [_key(1, index, block) for block in range(rng.randint(1, shape.suffix_blocks))]
        requests.append([[make_offload_key(h, g) for g in range(shape.num_groups)] for h in hashes])
    return requests


def compare(policy: str, shape: TraceShape, vllm: VLLMKVOffload) -> Comparison:
    """Replay one trace into a kvref and a vLLM manager side by side and compare their stores."""
    ours = CPUOffloadingManager(shape.num_blocks, policy)
    theirs: Any = vllm.manager_class(num_chunks=shape.num_blocks, cache_policy=policy)
    result = Comparison(policy)
    waiting = deque(_make_requests(shape))
    running: list[_Request] = []
    # (step due, request, stored keys, loaded keys): completions delivered `lag` steps later.
    in_flight: deque[tuple[int, _Request, tuple[list[OffloadKey], list[OffloadKey]], list[OffloadKey]]] = deque()
    finished: list[_Request] = []
    step = 0
    while waiting or running or in_flight:
        step += 1
        while in_flight and in_flight[0][0] <= step:
            _, request, stored, loaded = in_flight.popleft()
            ours.complete_store(stored[0], request.kvref_context)
            theirs.complete_store(stored[1], request.vllm_context)
            if loaded:
                ours.complete_load(loaded, request.kvref_context)
                theirs.complete_load(loaded, request.vllm_context)
        while waiting and len(running) < shape.concurrency:
            index = len(finished) + len(running)
            running.append(_start(waiting.popleft(), index, shape, ours, theirs, vllm))
        for request in list(running):
            blocks = request.keys[request.next_block : request.next_block + shape.blocks_per_step]
            request.next_block += len(blocks)
            keys = [key for block in blocks for key in block]
            mine = ours.prepare_store(keys, request.kvref_context)
            other = theirs.prepare_store(keys, request.vllm_context)
            result.stores += 1
            evicting = mine is None or other is None or bool(mine.evicted_keys or other.evicted_keys)
            if evicting:
                result.evicting_stores += 1
                same = (mine is None and other is None) or (
                    mine is not None and other is not None and mine.evicted_keys == other.evicted_keys
                )
                result.agreeing_stores += same
                if not same and result.first_disagreement is None:
                    result.first_disagreement = result.stores
            # Each side completes what it prepared: once they disagree, their contents differ
            # and the comparison goes on with what each holds (later stores count as they go).
            their_stored: list[OffloadKey] = other.keys_to_store if other is not None else []
            stored = (mine.keys_to_store if mine is not None else [], their_stored)
            # The hits' load completes with the request's first store job.
            loaded, request.loaded = request.loaded, []
            in_flight.append((step + shape.lag, request, stored, loaded))
            if request.next_block >= len(request.keys):
                running.remove(request)
                finished.append(request)
                ours.on_request_finished(request.kvref_context)
                theirs.on_request_finished(request.vllm_context)
    return result


def _start(
    keys: list[list[OffloadKey]],
    index: int,
    shape: TraceShape,
    ours: CPUOffloadingManager,
    theirs: Any,
    vllm: VLLMKVOffload,
) -> _Request:
    theirs_context = vllm.req_context_class(f"req-{index}")
    request = _Request(index, keys, ReqContext(f"req-{index}"), theirs_context)
    hit = vllm.lookup_result.HIT
    for position, block in enumerate(keys, start=1):
        for key in block:
            request.kvref_context.set_offload_key_position(key, position * shape.block_tokens)
            theirs_context.set_offload_key_position(key, position * shape.block_tokens)
    ours.on_new_request(request.kvref_context)
    theirs.on_new_request(theirs_context)
    # Maximal prefix: a block hits when every group's key is ready in both (only after a
    # disagreement can one side hold what the other lacks).
    hits = 0
    for block in keys:
        if not all(ours.lookup(key, request.kvref_context) is LookupResult.HIT for key in block):
            break
        if not all(theirs.lookup(key, theirs_context) is hit for key in block):
            break
        hits += 1
    request.hits = request.next_block = hits
    flat = [key for block in keys for key in block]
    loaded = [key for block in keys[:hits] for key in block]
    if loaded:
        ours.prepare_load(loaded, request.kvref_context)
        theirs.prepare_load(loaded, theirs_context)
        request.loaded = loaded
    ours.touch(flat, request.kvref_context)
    theirs.touch(flat, theirs_context)
    return request


class _Policies(enum.Enum):
    lru = "lru"
    arc = "arc"


def run(shape: TraceShape, policies: Sequence[str], vllm: VLLMKVOffload) -> list[Comparison]:
    """Compare every policy on `shape`'s trace."""
    return [compare(policy, shape, vllm) for policy in policies]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compare_vllm_manager.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    defaults = TraceShape()
    parser.add_argument("--blocks", type=int, default=defaults.num_blocks, help="CPU cache size, in blocks")
    parser.add_argument("--requests", type=int, default=defaults.num_requests, help="requests replayed")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency, help="requests running at once")
    parser.add_argument("--groups", type=int, default=defaults.num_groups, help="KV-cache groups")
    parser.add_argument("--seeds", type=int, default=3, help="traces per policy (seeds 0..n-1)")
    parser.add_argument("--policies", nargs="+", choices=[p.value for p in _Policies], default=["lru", "arc"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if min(args.blocks, args.requests, args.concurrency, args.groups, args.seeds) < 1:
        print("error: --blocks, --requests, --concurrency, --groups and --seeds must be >= 1", file=sys.stderr)
        return 2
    vllm = load_vllm_kv_offload()
    print(f"# kvref vs {VLLM_SPEC}: evicting stores with identical evictions")
    print("| policy | seed | stores | evicting | agreeing | agreement |")
    print("|---|---:|---:|---:|---:|---:|")
    worst = 1.0
    for seed in range(args.seeds):
        shape = TraceShape(
            num_blocks=args.blocks,
            num_requests=args.requests,
            concurrency=args.concurrency,
            num_groups=args.groups,
            seed=seed,
        )
        for row in run(shape, args.policies, vllm):
            worst = min(worst, row.agreement)
            print(
                f"| {row.policy} | {seed} | {row.stores} | {row.evicting_stores} | "
                f"{row.agreeing_stores} | {row.agreement:.2%} |"
            )
    print(f"worst agreement: {worst:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
