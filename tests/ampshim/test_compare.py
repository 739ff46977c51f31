"""``python -m ampshim compare``: an exact migration trains the same; each deliberate mistake
differs at the step it first shows, for the cause it is; a run that cannot start says so.

The mistakes are small edits of ``fixtures/compare/migrated.py`` (a hand migration of
``original.py``), each the kind of wrong rewrite a codemod or a person can make.
"""
import json
from pathlib import Path

import pytest

from ampshim.compare import COULD_NOT_RUN, DIFFERS, SAME, Target, compare
from ampshim.compare import report
from ampshim.compare.cli import main as compare_main

pytestmark = pytest.mark.slow  # end-to-end runs of two scripts: `-m slow`, and in CI

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "compare"
ORIGINAL = FIXTURES / "original.py"
MIGRATED = (FIXTURES / "migrated.py").read_text()

UNSCALE = "        scaler.unscale_(optimizer)\n"
AUTOCAST_LOSS = ("        with torch.autocast(\"cuda\", dtype=torch.float16):\n"
                 "            loss = F.cross_entropy(model(inputs), targets)\n")
STEP_AND_UPDATE = "        scaler.step(optimizer)\n        scaler.update()\n"
STEP_BLOCK = UNSCALE + "        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)\n" + STEP_AND_UPDATE


def indented(block):
    return "".join("    " + line if line.strip() else line for line in block.splitlines(True))


# name: (replace this in migrated.py, with this, arguments of both, cause, step where it shows)
MISTAKES = {
    "clipped while scaled": (UNSCALE, "", [], "clip-scaled", 1),
    "loss outside autocast": (
        AUTOCAST_LOSS,
        "        with torch.autocast(\"cuda\", dtype=torch.float16):\n"
        "            output = model(inputs)\n"
        "        loss = F.cross_entropy(output, targets)\n", [], "loss-precision", 1),
    "unscale_ twice": (UNSCALE, UNSCALE * 2, [], "crash", 1),
    "update dropped": (STEP_AND_UPDATE, "        scaler.step(optimizer)\n", [], "crash", 2),
    "static scale made dynamic": (",\n                                      growth_interval=2**31 - 1",
                                  "", ["--loss-scale", "128"], "scale-schedule", 1),
    "scale started elsewhere": ('scaler = torch.amp.GradScaler("cuda")',
                                'scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)', [],
                                "loss-scale", 1),
    "step in a branch that never runs": (
        STEP_BLOCK, "        if args.iterations > 1000:\n" + indented(STEP_BLOCK), [],
        "never-steps", None),
    "forward left in fp32": ('with torch.autocast("cuda", dtype=torch.float16):', "if True:", [],
                             "forward-precision", 1),
    "learning rate halved": ("lr=args.lr", "lr=args.lr * 0.5", [], "loss", 2),
}


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def run_compare(original, migrated, args=(), **options):
    options.setdefault("device", "cpu")
    options.setdefault("parallel", True)
    options.setdefault("timeout", 240)
    return compare(Target(str(original)), Target(str(migrated)), list(args), **options)


def test_an_exact_migration_trains_the_same(tmp_path):
    result = run_compare(ORIGINAL, FIXTURES / "migrated.py")
    assert result.verdict == SAME, report.as_text(result)
    assert result.exit_code == 0
    steps = result.original.ranks[0].steps
    assert len(steps) == 20 and all(step.taken for step in steps)
    assert {b.half_dtype for step in steps for b in step.backwards} == {"bfloat16"}
    assert all(len(step.clips) == 1 for step in steps)
    text = report.as_text(result)
    assert "SAME: 20 optimizer steps" in text and "bfloat16" in text


def test_a_static_scale_migrated_as_static_trains_the_same():
    result = run_compare(ORIGINAL, FIXTURES / "migrated.py", ["--loss-scale", "128"], steps=6)
    assert result.verdict == SAME, report.as_text(result)
    assert {b.scale for b in result.migrated.ranks[0].all_backwards()} == {128.0}


@pytest.mark.parametrize("mistake", sorted(MISTAKES), ids=lambda name: name.replace(" ", "-"))
def test_a_wrong_rewrite_differs_at_its_step_for_its_cause(mistake, tmp_path):
    old, new, args, cause, step = MISTAKES[mistake]
    assert MIGRATED.count(old) == 1, f"the mistake {mistake!r} no longer applies to migrated.py"
    wrong = write(tmp_path, "wrong.py", MIGRATED.replace(old, new))
    result = run_compare(ORIGINAL, wrong, args, steps=6)
    text = report.as_text(result)
    assert result.verdict == DIFFERS and result.exit_code == 1, text
    assert (result.difference.cause, result.difference.step) == (cause, step), text
    assert f"DIFFERS {'at step %d' % step if step else 'over the whole run'}" in text


def test_a_crash_in_the_migrated_script_is_shown_with_its_error(tmp_path):
    wrong = write(tmp_path, "wrong.py", MIGRATED.replace(UNSCALE, UNSCALE * 2))
    result = run_compare(ORIGINAL, wrong, steps=3)
    text = report.as_text(result)
    assert "unscale_() has already been called" in result.difference.message
    assert "The migrated script's error:" in text and "Traceback" in text


def test_an_original_that_crashes_could_not_run(tmp_path):
    broken = write(tmp_path, "broken.py", ORIGINAL.read_text().replace(
        "optimizer.step()", "raise ValueError('the data ran out')"))
    result = run_compare(broken, FIXTURES / "migrated.py", steps=3)
    assert result.verdict == COULD_NOT_RUN and result.exit_code == 2
    assert result.failed_side == "original"
    assert "ValueError: the data ran out" in report.as_text(result)


def test_a_migration_that_still_imports_apex_is_incomplete(tmp_path):
    result = run_compare(ORIGINAL, ORIGINAL, steps=3)
    assert result.verdict == COULD_NOT_RUN and result.failed_side == "migrated"
    assert result.original.not_run  # stopped: its run can change nothing
    text = report.as_text(result)
    assert "COULD NOT RUN: the migrated script imports apex, which it cannot have" in text
    assert "the migration is incomplete" in text and "--allow-apex" in text
    allowed = run_compare(ORIGINAL, ORIGINAL, steps=3, allow_apex=True)
    assert allowed.verdict == SAME, report.as_text(allowed)


def test_one_after_the_other_the_migration_runs_first_and_a_failed_one_alone(tmp_path):
    """An apex import caught by the script, which then raises its own error: the headline still
    says the migration is incomplete; the original is not run at all."""
    reraised = write(tmp_path, "reraised.py", "try:\n    from apex import amp\nexcept ImportError:\n"
                     "    raise ImportError('Please install apex to run this script.')\n")
    result = run_compare(ORIGINAL, reraised, steps=3, parallel=False)
    assert result.verdict == COULD_NOT_RUN and result.original.not_run
    text = report.as_text(result)
    assert "(apex, on ampshim, not run)" in text
    assert "the migrated script imports apex, which it cannot have" in text
    assert "Please install apex" in text
    # the script's traceback as python prints it: the script's own frame first
    assert f'Traceback (most recent call last):\n    File "{reraised}", line 4' in text


def test_a_guarded_apex_import_left_in_the_migration_is_a_note(tmp_path):
    guarded = write(tmp_path, "guarded.py", "try:\n    from apex import amp\nexcept ImportError:\n"
                    "    amp = None\n" + MIGRATED)
    result = run_compare(ORIGINAL, guarded, steps=3)
    assert result.verdict == SAME, report.as_text(result)
    assert any("tried to import apex" in note for note in result.notes)


def test_scripts_that_never_step_could_not_be_compared(tmp_path):
    idle = write(tmp_path, "idle.py", "import torch\nprint(torch.ones(2).sum())\n")
    result = run_compare(idle, idle, steps=3, allow_apex=True)
    assert result.verdict == COULD_NOT_RUN and result.failed_side is None
    assert "neither script took an optimizer step" in report.as_text(result)
    assert "COULD NOT COMPARE" in report.as_text(result)


def test_a_run_shorter_than_the_steps_asked_for_is_compared_to_its_end():
    result = run_compare(ORIGINAL, FIXTURES / "migrated.py", ["--iterations", "4"], steps=50)
    assert result.verdict == SAME, report.as_text(result)
    assert len(result.original.ranks[0].steps) == 4


def test_the_command_line_json_and_exit_codes(tmp_path, capsys):
    wrong = write(tmp_path, "wrong.py", MIGRATED.replace("lr=args.lr", "lr=args.lr * 0.5"))
    code = compare_main(["--device", "cpu", "--steps", "3", "--parallel", "--output-format",
                         "json", str(ORIGINAL), str(wrong), "--", "--iterations", "5"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1 and document["verdict"] == "differs" and document["exit_code"] == 1
    assert document["difference"]["step"] == 2 and document["difference"]["cause"] == "loss"
    steps = document["original"]["ranks"]["0"]["steps"]
    assert [step["number"] for step in steps] == [1, 2, 3]
    assert steps[0]["backwards"][0]["scale"] == 65536.0


def test_the_command_line_refuses_what_it_cannot_run(tmp_path, capsys):
    assert compare_main([str(ORIGINAL), str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        compare_main([str(ORIGINAL), str(ORIGINAL), "--epochs", "3"])
    assert usage.value.code == 2
    assert "go after --" in capsys.readouterr().err


def test_module_targets_run_in_their_own_directories(tmp_path):
    for name, source in (("before", ORIGINAL.read_text()), ("after", MIGRATED)):
        package = tmp_path / name / "trainer"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "train.py").write_text(source)
    result = compare(Target(module="trainer.train", cwd=str(tmp_path / "before")),
                     Target(module="trainer.train", cwd=str(tmp_path / "after")), [],
                     device="cpu", steps=4, parallel=True, timeout=240)
    assert result.verdict == SAME, report.as_text(result)


def test_plot_overlays_the_two_loss_curves(tmp_path):
    pytest.importorskip("matplotlib")
    from ampshim.compare.plot import plot

    wrong = write(tmp_path, "wrong.py", MIGRATED.replace("lr=args.lr", "lr=args.lr * 0.5"))
    result = run_compare(ORIGINAL, wrong, steps=5)
    plot(result, str(tmp_path / "losses.png"))
    assert (tmp_path / "losses.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    import sys

    from ampshim.compare.plot import MissingMatplotlib, plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = run_compare(ORIGINAL, FIXTURES / "migrated.py", steps=2)
    with pytest.raises(MissingMatplotlib, match="pip install matplotlib"):
        plot(result, str(tmp_path / "losses.png"))


def test_a_dataloader_with_worker_processes():
    result = run_compare(ORIGINAL, FIXTURES / "migrated.py", ["--workers", "2"], steps=5)
    assert result.verdict == SAME, report.as_text(result)
    assert len(result.migrated.ranks[0].steps) == 5


def test_two_ranks_under_torchrun(tmp_path):
    wrong = write(tmp_path, "wrong.py", MIGRATED.replace(UNSCALE, ""))
    for migrated, verdict in ((FIXTURES / "migrated.py", SAME), (wrong, DIFFERS)):
        result = run_compare(ORIGINAL, migrated, steps=4, nproc_per_node=2)
        assert result.verdict == verdict, report.as_text(result)
        assert set(result.original.ranks) == set(result.migrated.ranks) == {0, 1}
    assert result.difference.cause == "clip-scaled" and result.difference.step == 1


def test_python_m_ampshim_compare_is_the_entry_point():
    import subprocess
    import sys

    completed = subprocess.run([sys.executable, "-m", "ampshim", "compare", "--help"],
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert "exit status: 0 same, 1 differs, 2 could not run" in completed.stdout


@pytest.mark.parametrize("script, via", [
    ("fp16_optimizer.py", "FP16_Optimizer.backward"),
    ("old_handle_api.py", "amp.scale_loss"),
    ("train_o2_batchnorm.py", "amp.scale_loss"),
])
def test_each_apex_front_end_is_recorded(script, via):
    """apex's FP16_Optimizer, the 2018 handle and O2's master weights: a script against itself
    (apex served to both) is the same, and its steps, scale and half-precision forward are seen."""
    legacy = ROOT / "fixtures" / "legacy" / script
    result = run_compare(legacy, legacy, steps=4, allow_apex=True)
    assert result.verdict == SAME, report.as_text(result)
    steps = result.original.ranks[0].steps
    assert len(steps) == 4 and all((step.grad_norm is not None) == step.taken for step in steps)
    backwards = list(result.original.ranks[0].all_backwards())
    assert {b.via for b in backwards} == {via}
    assert all(b.matmul and b.half == b.matmul for b in backwards)


# Run in a fresh interpreter: as the generator's bench does, it imports apex and torch and only
# then forks its sides (this test process has run torch already).
_FORKED_SIDES = '''
import json, sys
from ampshim.compare import Target, compare
import apex.amp  # served here: a blocked side must still not get it
original, migrated, wrong = sys.argv[1:4]
runs = {}
for fork in (False, True):
    result = compare(Target(original), Target(migrated), [], device="cpu", steps=5,
                     parallel=True, timeout=240, fork=fork)
    runs[fork] = [result.verdict] + [
        [[b.loss for b in step.backwards] + [step.grad_norm] for step in side.ranks[0].steps]
        for side in (result.original, result.migrated)]
incomplete = compare(Target(original), Target(original), [], device="cpu", steps=3, fork=True)
crash = compare(Target(original), Target(wrong), [], device="cpu", steps=3, fork=True)
try:
    compare(Target(original), Target(migrated), [], device="cpu", nproc_per_node=2, fork=True)
    refused = None
except ValueError as error:
    refused = str(error)
print(json.dumps({"new": runs[False], "fork": runs[True], "refused": refused,
                  "incomplete": [incomplete.verdict, incomplete.failed_side],
                  "crash": [crash.verdict, crash.difference and crash.difference.message,
                            crash.migrated.stderr]}))
'''


def test_sides_forked_from_one_process_record_what_new_interpreters_do(tmp_path):
    import subprocess
    import sys

    wrong = write(tmp_path, "wrong.py", MIGRATED.replace(UNSCALE, UNSCALE * 2))
    completed = subprocess.run(
        [sys.executable, "-c", _FORKED_SIDES, str(ORIGINAL), str(FIXTURES / "migrated.py"),
         str(wrong)], capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr
    found = json.loads(completed.stdout.splitlines()[-1])
    assert found["new"][0] == SAME and len(found["new"][1]) == 5
    assert found["fork"] == found["new"]  # the same verdict and the same losses, step by step
    assert found["refused"] and "one rank" in found["refused"]
    assert found["incomplete"] == [COULD_NOT_RUN, "migrated"]
    verdict, message, stderr = found["crash"]
    assert verdict == DIFFERS and "unscale_() has already been called" in message
    assert "Traceback" in stderr
