"""A hypothesis state machine over the filesystem tier, with damage and restarts.

Invariants: a load that reports success returned exactly the stored bytes; a block whose load
failed is a miss afterwards (for every new request); the root's block files never exceed the capacity; a lookup hits
exactly when the block's file exists; and a restart keeps every block, also on a full disk.
Loads run alone or two at a time (concurrent promotions sharing blocks).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from typing_extensions import override

from kvref.base import OffloadKey
from kvref.tiering.base import TransferJob
from kvref.tiering.fs import FileSystemSecondaryTier
from kvref.tiering.fs.format import RECORD_HEADER_BYTES, file_bytes, header_bytes
from tests.tiering.helpers import BLOCK_BYTES, CTX, content, holds, make_spec, make_view, to_keys

KEYS = to_keys(range(10))
NUM_BLOCKS = 4
RECORD = file_bytes(12, BLOCK_BYTES)  # one block file of a 12-byte test key
CAPACITY = 6 * RECORD
HEADER = RECORD_HEADER_BYTES + 12
PAYLOAD_OFFSET = header_bytes(12)
COVERED = HEADER + BLOCK_BYTES


class FsTierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="kvref-fs-"))
        self.view = make_view(NUM_BLOCKS)
        self.rows = self.view.cast("B")
        self.tier = self.open_tier()
        self.job_ids = 0
        self.damaged: set[OffloadKey] = set()

    def open_tier(self) -> FileSystemSecondaryTier:
        return FileSystemSecondaryTier(
            make_spec(),
            self.view,
            "fs",
            root_dir=self.root,
            capacity_bytes=CAPACITY,
            n_read_threads=1,
            n_write_threads=1,
        )

    @override
    def teardown(self) -> None:
        self.tier.shutdown()
        self.rows.release()
        shutil.rmtree(self.root, ignore_errors=True)

    def run(self, keys: list[OffloadKey], promotion: bool) -> bool:
        self.job_ids += 1
        block_ids = list(range(len(keys)))
        job = TransferJob(self.job_ids, tuple(keys), tuple(block_ids), promotion, CTX)
        (self.tier.submit_load if promotion else self.tier.submit_store)(job)
        self.tier.drain_jobs()
        (result,) = self.tier.get_finished_jobs()
        assert result.job_id == self.job_ids
        return result.success

    def held(self, keys: list[OffloadKey] = KEYS) -> dict[OffloadKey, bool]:
        """Whether the tier answers HIT for each key (to a new request)."""
        return dict(zip(keys, holds(self.tier, keys)))

    def row(self, block_id: int) -> bytes:
        return bytes(self.rows[block_id * BLOCK_BYTES : (block_id + 1) * BLOCK_BYTES])

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=NUM_BLOCKS))
    def store(self, keys: list[OffloadKey]) -> None:
        for block_id, key in enumerate(keys):
            self.rows[block_id * BLOCK_BYTES : (block_id + 1) * BLOCK_BYTES] = content(key)
        if self.run(keys, promotion=False):
            # A key already stored was skipped (its old file, maybe damaged, remains).
            missing = [key.hex() for key, held in self.held(keys).items() if not held]
            assert not missing, f"{missing} not stored by a successful job"

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=NUM_BLOCKS, unique=True))
    def load(self, keys: list[OffloadKey]) -> None:
        present = list(self.held(keys).values())
        self.rows[:] = bytes(len(self.rows))
        ok = self.run(keys, promotion=True)
        if ok:
            assert all(present)
            for block_id, key in enumerate(keys):
                assert self.row(block_id) == content(key), f"wrong bytes for {key.hex()}"
            assert not self.damaged.intersection(keys)
        elif all(present):
            # Every block was read: the job failed because of a damaged one, now a miss.
            assert self.damaged.intersection(keys)
            assert not any(self.held(sorted(self.damaged.intersection(keys))).values())
        # A damaged file that was read is deleted (a later store writes a good one).
        for key, held in self.held(sorted(self.damaged.intersection(keys))).items():
            if not held:
                self.damaged.discard(key)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=3))
    def touch(self, keys: list[OffloadKey]) -> None:
        self.tier.touch(keys, CTX)

    @rule(key=st.sampled_from(KEYS), where=st.integers(0, COVERED - 1))
    def damage(self, key: OffloadKey, where: int) -> None:
        # A byte the checksums cover: the header and key, or the payload (the zero padding
        # after each is never read into a row).
        if where >= HEADER:
            where += PAYLOAD_OFFSET - HEADER
        location = self.tier.location(key)
        if location is None or key in self.damaged:
            return  # a second flip of the same byte would undo the first
        path, _offset, _size = location
        with open(path, "r+b") as file:
            file.seek(where)
            byte = file.read(1)
            file.seek(where)
            file.write(bytes([byte[0] ^ 0x5A]))
        self.damaged.add(key)

    @rule(keys_a=st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True),
          keys_b=st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True))
    def concurrent_loads(self, keys_a: list[OffloadKey], keys_b: list[OffloadKey]) -> None:
        present = {key for key, held in self.held().items() if held}
        self.rows[:] = bytes(len(self.rows))
        jobs: dict[int, list[tuple[OffloadKey, int]]] = {}
        for keys, first_block in ((keys_a, 0), (keys_b, 2)):
            self.job_ids += 1
            block_ids = [first_block + i for i in range(len(keys))]
            jobs[self.job_ids] = list(zip(keys, block_ids))
            self.tier.submit_load(TransferJob(self.job_ids, tuple(keys), tuple(block_ids), True, CTX))
        self.tier.drain_jobs()
        results = {result.job_id: result.success for result in self.tier.get_finished_jobs()}
        assert set(results) == set(jobs)
        for job_id, placed in jobs.items():
            keys = [key for key, _ in placed]
            if results[job_id]:
                assert present.issuperset(keys) and not self.damaged.intersection(keys)
                for key, block_id in placed:
                    assert self.row(block_id) == content(key), f"wrong bytes for {key.hex()}"
        for key, held in self.held(sorted(self.damaged)).items():
            if not held:
                self.damaged.discard(key)

    @contextlib.contextmanager
    def full_disk(self) -> Generator[None, None, None]:
        def no_space(*args: object, **kwargs: object) -> Any:
            raise OSError(errno.ENOSPC, "No space left on device")

        real_open = os.open

        def open_without_creating(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
            if flags & os.O_CREAT and not os.path.exists(path):
                no_space()
            return real_open(path, flags, mode, **kwargs)

        saved: list[tuple[Any, str, Any]] = [
            (os, "write", os.write),
            (os, "pwrite", os.pwrite),
            (os, "writev", os.writev),
            (os, "pwritev", os.pwritev),
            (os, "open", os.open),
            (Path, "write_text", Path.write_text),
        ]
        for owner, name, _ in saved:
            setattr(owner, name, open_without_creating if name == "open" else no_space)
        try:
            yield
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)

    @rule(full=st.booleans())
    def restart(self, full: bool) -> None:
        before = {key for key, held in self.held().items() if held}
        self.tier.shutdown()
        with self.full_disk() if full else contextlib.nullcontext():
            self.tier = self.open_tier()
            # Served while the disk is still full.
            after_full = {key for key, held in self.held().items() if held}
        after = {key for key, held in self.held().items() if held}
        assert before == after, before ^ after  # nothing re-indexed: the files are the truth
        assert after <= before, after - before  # nothing dropped comes back
        assert after_full == after
        self.damaged &= after

    @invariant()
    def lookups_match_files_and_capacity(self) -> None:
        root_bytes = sum(path.stat().st_size for path in self.root.rglob("*.kvb"))
        assert root_bytes <= CAPACITY
        assert self.tier.used_bytes <= CAPACITY
        assert self.held() == {key: os.path.exists(self.tier.block_path(key)) for key in KEYS}


FsTierMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=20, deadline=None)
test_fs_tier_never_returns_wrong_bytes = FsTierMachine.TestCase
