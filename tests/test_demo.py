"""`kvref demo`: the end-to-end round trip passes, and its verification does catch corruption."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvref.cpu.gpu_worker as gpu_worker
from kvref.cli import app
from kvref.cli import demo_main as main
from kvref.cpu.common import CPUOffloadingMetrics
from kvref.cpu.transfer_plan import TransferPlan
from kvref.demo import DemoConfig, run_demo
from kvref.tiering.base import TieringOffloadingMetrics

CHECKOUT = Path(__file__).resolve().parents[1]

SMALL = ["--requests", "8", "--documents", "2", "--doc-blocks", "3", "--cpu-blocks", "12", "--device", "cpu"]


def small(**changes: int | str | bool) -> DemoConfig:
    return replace(
        DemoConfig(requests=10, documents=2, doc_blocks=3, num_cpu_blocks=12, device="cpu"), **changes
    )


def test_demo_main_round_trips_every_byte(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    assert "CPU tier" in out and "Tiering" in out
    assert "GPU->CPU" in out and "CPU->GPU" in out
    assert out.count("reloaded into different GPU blocks): OK") == 2
    assert "manager stats:" in out and "cpu_allocation_size: " in out  # get_stats, summed


def test_the_cpu_tier_offloads_evicts_reloads_and_verifies() -> None:
    (report,) = run_demo(small(tiering=False))
    assert report.ok, report.mismatches + report.failed_jobs
    assert report.hits > 0 and report.evicted_blocks > 0
    assert report.store.jobs > 0 and report.load.jobs > 0
    assert report.verified_blocks == report.load.gpu_blocks > 0
    assert report.sweep_blocks > 0
    assert report.store.bytes > 0 and report.load.bytes > 0
    stats = report.manager_stats
    assert stats is not None
    summary = stats.reduce()
    # One allocation sample per prepare_store that stored something, its chunks summed.
    assert summary[f"{CPUOffloadingMetrics.CPU_ALLOCATION_SIZE}_sum"] == report.stored_blocks > 0
    assert 0 <= summary[CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC] <= 1


def test_the_filesystem_tier_gives_evicted_blocks_back() -> None:
    cpu, tiering = run_demo(small(requests=12))
    assert cpu.ok and tiering.ok, tiering.mismatches + tiering.failed_jobs
    assert tiering.evicted_blocks > 0
    # Chunks the CPU tier evicted come back from disk (HIT_PENDING while promoted, then HIT)...
    assert tiering.retried_hits > 0
    assert tiering.hit_rate > cpu.hit_rate
    assert tiering.manager_stats is not None
    summary = tiering.manager_stats.reduce()
    assert summary[f"{TieringOffloadingMetrics.CHUNK_HITS}:('1:fs',)"] > 0  # the fs tier's hits
    # ...and every chunk ever stored is still somewhere: the sweep reloads all of them.
    assert tiering.sweep_blocks == tiering.distinct_stored_blocks > cpu.sweep_blocks


@pytest.mark.parametrize("factor", [1, 3])
def test_demo_with_other_block_size_factors(factor: int) -> None:
    config = small(requests=6, doc_blocks=2, num_cpu_blocks=10, block_size_factor=factor)
    for report in run_demo(config):
        assert report.ok, report.mismatches + report.failed_jobs


def test_demo_fails_when_a_reload_lands_one_block_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_plan = gpu_worker.plan_transfer

    def corrupting_plan(src_block_ids: Sequence[int], dst_block_ids: Sequence[int], **kwargs: object) -> TransferPlan:
        if kwargs["src_blocks_per_chunk"] == 1:
            return real_plan(src_block_ids, dst_block_ids, **kwargs)  # type: ignore[arg-type]  # stores stay right
        # Loads: every GPU block receives its neighbour's page.
        shifted = [*dst_block_ids[1:], dst_block_ids[0]]
        return real_plan(src_block_ids, shifted, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gpu_worker, "plan_transfer", corrupting_plan)
    assert main([*SMALL, "--block-size-factor", "2", "--no-tiering"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "bytes differ" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "1"], "layers must be >= 2"),
        (["--cpu-blocks", "4"], "num_cpu_blocks must be >= 16"),
        (["--gpu-blocks", "8"], "num_gpu_blocks must be >= 32"),
    ],
)
def test_demo_rejects_bad_settings(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_kvref_demo_command_passes_options_through() -> None:
    result = CliRunner().invoke(app, ["demo", *SMALL])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output
    help_result = CliRunner().invoke(app, ["demo", "--help"])
    assert help_result.exit_code == 0
    assert "--block-size-factor" in help_result.output


def test_kvref_demo_without_torch_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # A site directory whose `torch` cannot be found: an interpreter without the extra.
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class _NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NoTorch())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(CHECKOUT)])}
    completed = subprocess.run(
        [sys.executable, "-m", "kvref", "demo"], env=env, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 2
    assert completed.stderr == "kvref: error: `kvref demo` needs torch: pip install 'kvref[torch]'\n"
    helped = subprocess.run(
        [sys.executable, "-m", "kvref", "demo", "--help"], env=env, capture_output=True, text=True, check=False
    )
    assert helped.returncode == 0 and "--layers" in helped.stdout


@pytest.mark.parametrize("argv", [[], ["--requests", "2", "--device", "cpu"]])
def test_kvref_demo_with_torch_unimportable_is_one_line_and_exit_2(argv: list[str]) -> None:
    # `sys.modules['torch'] = None`: every `import torch` fails, as without the extra.
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        f"sys.argv = ['kvref', 'demo', *{argv!r}]\n"
        "from kvref.console import main\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    completed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, cwd=CHECKOUT
    )
    assert (completed.returncode, completed.stdout) == (2, "")
    assert completed.stderr == "kvref: error: `kvref demo` needs torch: pip install 'kvref[torch]'\n"


BROKEN_TORCH = [
    # torch installed, but a CUDA library it links is missing: the dynamic loader's OSError.
    pytest.param(
        "raise OSError('libcudart.so.12: cannot open shared object file: No such file or directory')",
        "OSError: libcudart.so.12: cannot open shared object file: No such file or directory",
        id="cuda-library",
    ),
    # A torch built for another Python or against other libraries.
    pytest.param(
        "raise ImportError('libtorch_cpu.so: undefined symbol: _ZN3c10')",
        "ImportError: libtorch_cpu.so: undefined symbol: _ZN3c10",
        id="abi",
    ),
    # One of torch's own dependencies is missing (torch itself was found).
    pytest.param(
        "import sympy_is_not_installed_here",
        "ModuleNotFoundError: No module named 'sympy_is_not_installed_here'",
        id="dependency",
    ),
]


@pytest.mark.parametrize(("torch_init", "error"), BROKEN_TORCH)
def test_kvref_demo_with_torch_that_fails_to_import_is_one_line_and_exit_2(
    torch_init: str, error: str, tmp_path: Path
) -> None:
    # A `torch` package ahead of any installed one, failing as a broken install does.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch/__init__.py").write_text(torch_init + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(CHECKOUT)])}
    completed = subprocess.run(
        [sys.executable, "-m", "kvref", "demo", "--requests", "2", "--device", "cpu"],
        env=env, capture_output=True, text=True, check=False,
    )
    assert (completed.returncode, completed.stdout) == (2, ""), completed.stderr
    assert completed.stderr == (
        f"kvref: error: `kvref demo` needs torch, which is installed but fails to import: {error}\n"
    )


def test_torch_warning_that_numpy_is_missing_is_not_shown(tmp_path: Path) -> None:
    # The CPU wheel of torch warns on import without numpy (`make run` installs none).
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch/__init__.py").write_text(
        "import warnings\nwarnings.warn(\"Failed to initialize NumPy: No module named 'numpy'\", UserWarning)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(CHECKOUT)])}
    completed = subprocess.run(
        [sys.executable, "-c", "from kvref.cli import _require_torch; _require_torch(); print('imported')"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (completed.returncode, completed.stdout, completed.stderr) == (0, "imported\n", "")


def test_kvref_demo_usage_errors_exit_2_through_typer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "tpu"]) == 2
    assert main(["--layers", "many"]) == 2
    assert "Traceback" not in capsys.readouterr().err
