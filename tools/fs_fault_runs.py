"""Fault soak of the filesystem tier shared by many engines: writers killed mid-store.

    .venv/bin/python tools/fs_fault_runs.py --dir /work/tmp --rounds 5
    .venv/bin/python tools/fs_fault_runs.py --dir /work/tmp --rounds 3 --capacity-files 512
    .venv/bin/python tools/fs_fault_runs.py --dir /mnt/jfs-a/faults --other-mount-dir /mnt/jfs-b/faults

Each round runs `tests.tiering.fs_engines.kill_writers_while_loading` on a fresh root under
`--dir`: waves of writer processes store at full speed and are killed with SIGKILL at random
moments of their stores while two engine processes load (every block reported loaded is
checked byte for byte); once `--stale-tmp-s` passed, a later engine opens the root, and its
start-up sweep must remove every temporary file the dead writers left. On an unbounded root it
must also find every block a dead writer reported stored. `tests/tiering/test_fs_engines.py`
runs one short round of each kind, on the local disk and on two JuiceFS mounts.

`--other-mount-dir` names `--dir` as a second mount of the same shared volume shows it (another
host): writers, loaders and the later engines then alternate between the two mounts, and a later
engine on each must find every block.

Prints one line per round and the totals: kills, temporary files of dead writers found and
left after the sweep, blocks stored and checked, loads, and wrong bytes (must be 0). Exits 1 if
any round broke a rule.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.tiering.fs_engines import FILE_BYTES, KillReport, kill_writers_while_loading


def _broken_rules(report: KillReport) -> list[str]:
    broken: list[str] = []
    wrong_loads = [n for loader in report.loaders for n in loader["wrong"]]
    if wrong_loads or report.wrong:
        broken.append(f"wrong bytes reported loaded: {wrong_loads + report.wrong}")
    if report.after_sweep:
        broken.append(f"temporary files left after the sweep: {report.after_sweep}")
    if report.missing:
        broken.append(f"{len(report.missing)} blocks reported stored are missing")
    if report.lookups_wrong:
        broken.append(f"{report.lookups_wrong} lookups disagree with the files")
    if report.failed_loads:
        broken.append(f"{report.failed_loads} blocks present failed to load")
    return broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where roots go")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--waves", type=int, default=4, help="waves of writers per round")
    parser.add_argument("--writers", type=int, default=3, help="writers per wave")
    parser.add_argument("--capacity-files", type=int, default=None, help="capacity in block files")
    parser.add_argument("--stale-tmp-s", type=float, default=1.0)
    parser.add_argument(
        "--other-mount-dir", type=Path, default=None, help="--dir through a second mount of its volume"
    )
    args = parser.parse_args(argv)
    options: dict[str, Any] = {
        "stale_tmp_s": args.stale_tmp_s,
        "n_write_threads": 4,
        "capacity_bytes": None if args.capacity_files is None else args.capacity_files * FILE_BYTES,
    }
    totals = {"kills": 0, "dead_tmps": 0, "left": 0, "stored": 0, "checked": 0, "loads": 0, "wrong": 0}
    failures = 0
    for round_ in range(args.rounds):
        work = Path(tempfile.mkdtemp(prefix="kvref-fs-faults-", dir=args.dir))
        try:
            start = time.monotonic()
            report = kill_writers_while_loading(
                [work / "root"] + ([args.other_mount_dir / work.name / "root"] if args.other_mount_dir else []),
                work,
                options,
                waves=args.waves,
                writers_per_wave=args.writers,
                seed=round_ + 1,
            )
            seconds = time.monotonic() - start
        finally:
            shutil.rmtree(work, ignore_errors=True)
        loads = sum(loader["loaded"] for loader in report.loaders)
        wrong = len(report.wrong) + sum(len(loader["wrong"]) for loader in report.loaders)
        for name, value in (
            ("kills", report.kills),
            ("dead_tmps", report.dead_tmps),
            ("left", report.left),
            ("stored", report.stored),
            ("checked", report.checked),
            ("loads", loads),
            ("wrong", wrong),
        ):
            totals[name] += value
        broken = _broken_rules(report)
        failures += bool(broken)
        print(
            f"round {round_ + 1}: {report.kills} SIGKILLs, {report.dead_tmps} temporary files of "
            f"dead writers found, {report.left} left once all were dead, "
            f"{len(report.after_sweep)} after the sweep; {report.stored} blocks stored, "
            f"{report.checked} checked; {loads} blocks loaded during the kills, {wrong} wrong "
            f"({seconds:.1f} s){'; BROKEN: ' + '; '.join(broken) if broken else ''}",
            flush=True,
        )
    print(
        f"total ({args.rounds} rounds, capacity "
        f"{'none' if args.capacity_files is None else f'{args.capacity_files} files'}): "
        + ", ".join(f"{name} {value}" for name, value in totals.items())
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
