"""A rewrite keeps training the same, judged by ``python -m ampshim compare``: each legacy script
runs as written on ampshim, and as ``ampmigrate`` rewrote it (safe fixes, and ``--unsafe-fixes``)
on plain PyTorch with apex unavailable, from the same seed; compare must find them the same.

The scripts are written for CUDA where a GPU exists; both sides run with ``--device cpu``
(CUDA's autocast and GradScaler on the CPU, float16 as bfloat16), as on any CPU-only machine.
"""
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from ampshim.compare import COULD_NOT_RUN, SAME, Target, compare
from ampshim.compare.report import as_text
from migrate.api import migrate_paths, migrate_source

pytestmark = pytest.mark.slow  # an end-to-end run: `-m slow`, and in CI

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "fixtures" / "legacy"
SCRIPTS = sorted(path.name for path in LEGACY.glob("*.py"))

# Launched as their users launch them: two ranks under torchrun (gloo on the CPU).
TWO_RANKS = {"cuda_distributed.py", "cuda_imagenet.py"}
# Without --sync_bn: torch's SyncBatchNorm, the rewrite of apex's, needs CUDA under DDP.
ARGUMENTS = {"cuda_imagenet.py": ["--epochs", "1"]}
STEPS = 12
# O1 for inference only: no optimizer step for compare to follow; their printed outputs are held
# to each other instead.
INFERENCE_ONLY = {"inference_after_initialize.py", "inference_under_flag.py"}

apex_import = re.compile(r"^\s*(from|import)\s+apex\b", re.M)


def rewrite(source, name, mode):
    result = migrate_source(source, filename=name, unsafe_fixes=mode == "unsafe", select=["ALL"])
    assert result.error is None, result.error
    return result.new_source


def compare_in(tmp_path, original, migrated, verdict=SAME, args=(), **options):
    """Each side in a folder of its own: what one writes (a checkpoint) the other never reads."""
    folders = [tmp_path / "original", tmp_path / "migrated"]
    for folder in folders:
        folder.mkdir(exist_ok=True)
    result = compare(Target(str(original), cwd=str(folders[0])),
                     Target(str(migrated), cwd=str(folders[1])), list(args), device="cpu",
                     steps=STEPS,
                     parallel=True, timeout=300, **options)
    assert result.verdict == verdict, as_text(result)
    return result


def assert_same_printed_results(result):
    """The last JSON line each side printed: the same keys, dtypes, and numbers within 1%."""
    before, after = (json.loads(run.stdout.strip().splitlines()[-1])
                     for run in (result.original, result.migrated))
    assert before.keys() == after.keys()
    for key in before:
        a, b = before[key], after[key]
        if isinstance(a, list) and a and isinstance(a[0], (int, float)):
            assert len(a) == len(b) and all(
                math.isclose(x, y, rel_tol=1e-2, abs_tol=1e-3) for x, y in zip(a, b)), key
        else:
            assert a == b, key


@pytest.mark.parametrize("mode", ["safe", "unsafe"])
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.removesuffix(".py"))
def test_rewritten_script_trains_like_the_original(script, mode, tmp_path):
    source = (LEGACY / script).read_text()
    new_source = rewrite(source, script, mode)
    if new_source == source:
        pytest.skip(f"the {mode} rewrite changes nothing")
    if mode == "safe" and new_source == rewrite(source, script, "unsafe"):
        pytest.skip("the safe rewrite is the --unsafe-fixes one, compared there")
    rewritten = tmp_path / script
    rewritten.write_text(new_source)
    result = compare_in(tmp_path, LEGACY / script, rewritten,
                        COULD_NOT_RUN if script in INFERENCE_ONLY else SAME,
                        args=ARGUMENTS.get(script, ()),
                        allow_apex=bool(apex_import.search(new_source)),
                        nproc_per_node=2 if script in TWO_RANKS else 1)
    if script in INFERENCE_ONLY:
        assert result.problem and "neither script took an optimizer step" in result.problem
        assert_same_printed_results(result)
        return
    if script in TWO_RANKS:
        assert set(result.original.ranks) == {0, 1}
    assert all(trajectory.steps for trajectory in result.original.ranks.values())


def test_a_project_split_in_two_files_trains_like_the_original(tmp_path):
    """``amp.initialize`` in the script, ``amp.scale_loss`` in the module it imports: migrated
    together with safe fixes only, the pair trains as apex did."""
    original, rewritten = tmp_path / "original_tree", tmp_path / "rewritten_tree"
    shutil.copytree(LEGACY / "split_halves", original)
    shutil.copytree(LEGACY / "split_halves", rewritten)
    results = migrate_paths([rewritten])
    assert all(result.changed and result.error is None for result in results)
    for path in rewritten.iterdir():
        assert not apex_import.search(path.read_text()), path.read_text()
    compare_in(tmp_path, original / "train.py", rewritten / "train.py")
