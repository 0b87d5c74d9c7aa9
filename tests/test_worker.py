"""The `OffloadingWorker` contract, on kvref's CPU<->GPU worker, against a naive model.

Random interleavings of stores, loads (regular and expedited), refused jobs, polls and waits.
The model copies block by block into a dictionary; after every step the worker's GPU tensors
must match it, and every accepted job must be reported exactly once, successful, with the bytes
it moved.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from typing_extensions import override

from kvref.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    OffloadingWorker,
)
from kvref.cpu.common import CPULoadStoreSpec
from kvref.cpu.gpu_worker import CPUOffloadingWorker

NUM_GPU_BLOCKS = 10
NUM_CHUNKS = 4
BPC = 2
PAGES = (12, 8)  # tensor t holds group t; pages in bytes


class WorkerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        tensors = [
            torch.randint(-128, 128, (NUM_GPU_BLOCKS, page), dtype=torch.int8, generator=generator)
            for page in PAGES
        ]
        self.gpu = tensors
        caches = CanonicalKVCaches(
            [CanonicalKVCacheTensor(t, page) for t, page in zip(tensors, PAGES)],
            [[CanonicalKVCacheRef(t, page)] for t, page in enumerate(PAGES)],
        )
        self.worker: OffloadingWorker = CPUOffloadingWorker(caches, BPC, NUM_CHUNKS)
        self.gpu_model = [t.clone() for t in tensors]
        self.cpu_model: dict[tuple[int, int, int], torch.Tensor] = {}  # (tensor, chunk, sub) -> page
        self.pending: dict[int, int] = {}  # job id -> bytes it moves
        self.next_job = 0

    def _specs(
        self, data: st.DataObject
    ) -> tuple[GPULoadStoreSpec, CPULoadStoreSpec, list[list[tuple[int, int, int]]]]:
        """A valid spec pair, and per group its (GPU block, chunk, sub-block) units."""
        gpu_ids: list[int] = []
        chunk_ids: list[int] = []
        sizes: list[int] = []
        indices: list[int] = []
        units: list[list[tuple[int, int, int]]] = []
        for _ in PAGES:
            size = data.draw(st.integers(0, 3))
            index = data.draw(st.integers(0, 3))
            skip = index % BPC
            chunks = data.draw(st.permutations(range(NUM_CHUNKS)))[: -(-(size + skip) // BPC) if size else 0]
            blocks = data.draw(st.permutations(range(NUM_GPU_BLOCKS)))[:size]
            units.append([(b, chunks[(skip + i) // BPC], (skip + i) % BPC) for i, b in enumerate(blocks)])
            gpu_ids += blocks
            chunk_ids += chunks
            sizes.append(size)
            indices.append(index)
        return GPULoadStoreSpec(gpu_ids, sizes, indices), CPULoadStoreSpec(chunk_ids), units

    def _job(self) -> int:
        self.next_job += 1
        return self.next_job

    @rule(data=st.data())
    def store(self, data: st.DataObject) -> None:
        gpu_spec, cpu_spec, units = self._specs(data)
        job = self._job()
        assert self.worker.submit_store(job, gpu_spec, cpu_spec)
        for t, group in enumerate(units):
            for block, chunk, sub in group:
                self.cpu_model[(t, chunk, sub)] = self.gpu_model[t][block].clone()
        self.pending[job] = sum(len(group) * PAGES[t] for t, group in enumerate(units))

    @rule(data=st.data(), expedited=st.booleans())
    def load(self, data: st.DataObject, expedited: bool) -> None:
        gpu_spec, cpu_spec, units = self._specs(data)
        if any(
            (t, chunk, sub) not in self.cpu_model for t, group in enumerate(units) for _, chunk, sub in group
        ):
            return  # the scheduler only loads what was stored
        job = self._job()
        assert self.worker.submit_load(job, cpu_spec, gpu_spec, expedited=expedited)
        for t, group in enumerate(units):
            for block, chunk, sub in group:
                self.gpu_model[t][block] = self.cpu_model[(t, chunk, sub)]
        self.pending[job] = sum(len(group) * PAGES[t] for t, group in enumerate(units))

    @rule(data=st.data())
    def refused(self, data: st.DataObject) -> None:
        gpu_spec, _, _ = self._specs(data)
        with pytest.raises(ValueError):
            self.worker.submit_store(self._job(), gpu_spec, CPULoadStoreSpec([NUM_CHUNKS]))

    @rule()
    def poll(self) -> None:
        for result in self.worker.get_finished():
            assert result.success
            assert result.transfer_size == self.pending.pop(result.job_id)

    @rule(data=st.data())
    def wait(self, data: st.DataObject) -> None:
        ids = data.draw(st.sets(st.integers(0, self.next_job + 1), max_size=3))
        self.worker.wait(ids)

    @invariant()
    def gpu_matches_the_model(self) -> None:
        assert all(torch.equal(a, b) for a, b in zip(self.gpu, self.gpu_model))

    @override
    def teardown(self) -> None:
        self.poll()
        assert not self.pending, "a job was never reported"
        self.worker.shutdown()


TestWorkerContract = WorkerMachine.TestCase
TestWorkerContract.settings = settings(max_examples=20, stateful_step_count=15, deadline=None)
