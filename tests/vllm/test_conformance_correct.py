"""The conformance kit is right about correct code: it passes, unmodified, on vLLM 0.33's own fs
tier and `CPUOffloadingManager` (LRU and ARC, each held to kvref's reference of its policy), and
on both tiers of `kvref.integrations.vllm` (Redis against a real server started here)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from kvref.base import OffloadKey as KvrefKey
from kvref.integrations.vllm import FileSystemTier, RedisTier
from kvref.testing.vllm import DamageBlock, MakeManager, OffloadingManagerContract, SecondaryTierContract
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.redis import RedisSecondaryTier
from kvref.tiering.redis.local import LocalRedisServer
from kvref.tiering.redis.value_format import HEADER_BYTES
from vllm.v1.kv_offload.base import OffloadKey
from typing_extensions import override


class TestVLLMFileSystemTier(SecondaryTierContract):
    @pytest.fixture
    @override
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "fs", "root_dir": str(tmp_path / "vllm-fs"), "n_read_threads": 2, "n_write_threads": 2}

    @pytest.fixture
    @override
    def damage_block(self) -> DamageBlock:
        def damage(tier: SecondaryTierManager, block: OffloadKey) -> None:
            assert isinstance(tier, FileSystemTierManager)
            with open(tier.file_mapper.get_file_name(block), "r+b") as file:
                file.truncate(100)

        return damage


class TestKvrefFileSystemTier(SecondaryTierContract):
    @pytest.fixture
    @override
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "FileSystemTier", "module_path": "kvref.integrations.vllm", "root_dir": str(tmp_path / "fs")}

    @pytest.fixture
    @override
    def damage_block(self) -> DamageBlock:
        def damage(tier: SecondaryTierManager, block: OffloadKey) -> None:
            assert isinstance(tier, FileSystemTier) and isinstance(tier.kvref_tier, FileSystemSecondaryTier)
            location = tier.kvref_tier.location(KvrefKey(block))
            assert location is not None
            path, offset, _ = location
            with open(path, "r+b") as file:
                file.seek(offset + 200)
                file.write(os.urandom(16))

        return damage


class TestKvrefRedisTier(SecondaryTierContract):
    @pytest.fixture
    @override
    def tier_config(self, redis_server: LocalRedisServer) -> dict[str, Any]:
        return {
            "type": "RedisTier",
            "module_path": "kvref.integrations.vllm",
            "url": redis_server.url,
            "namespace": f"conformance-{uuid.uuid4().hex}",
        }

    @pytest.fixture
    @override
    def damage_block(self, redis_server: LocalRedisServer) -> DamageBlock:
        def damage(tier: SecondaryTierManager, block: OffloadKey) -> None:
            assert isinstance(tier, RedisTier) and isinstance(tier.kvref_tier, RedisSecondaryTier)
            redis_key = tier.kvref_tier.redis_key(KvrefKey(block))
            redis_server.command("SETRANGE", redis_key, str(HEADER_BYTES + 64), os.urandom(8))

        return damage


class TestVLLMCPUManagerLRU(OffloadingManagerContract):
    policy = "lru"

    @pytest.fixture
    @override
    def make_manager(self) -> MakeManager:
        return lambda num_chunks, enable_events: CPUOffloadingManager(num_chunks, "lru", enable_events=enable_events)


class TestVLLMCPUManagerARC(OffloadingManagerContract):
    policy = "arc"

    @pytest.fixture
    @override
    def make_manager(self) -> MakeManager:
        return lambda num_chunks, enable_events: CPUOffloadingManager(num_chunks, "arc", enable_events=enable_events)
