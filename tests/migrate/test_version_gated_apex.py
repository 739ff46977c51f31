"""apex kept for a torch older than native amp: its arms run only where ``torch.__version__`` is
below 1.6, or under a flag set True only there (``_use_apex``). They never run on a torch the
rewrite needs (nor under ampshim), so the safe rewrite removes them and keeps the native arms.

Generated over the ways scripts spell it: the version test (``packaging``'s ``version.parse``,
``LooseVersion``, a plain string, the comparison either way round), apex behind a flag or right
under the test, the flag alone or joined by ``and``, the apex arm first or after the native one,
and where the loop lives."""
from __future__ import annotations

import ast
import itertools

import pytest

from generated.small_scripts import compared, script_head
from migrate.api import migrate_source

OLD = {  # a test true only on a torch older than 1.6
    "packaging": 'version.parse(torch.__version__) < version.parse("1.6")',
    "loose": 'LooseVersion(torch.__version__) < LooseVersion("1.6.0")',
    "reversed": 'version.parse("1.6") > version.parse(torch.__version__)',
    "at_most": 'version.parse(torch.__version__) <= version.parse("1.5")',
}

def _prelude(test: str, gate: str) -> str:
    spelled = "from distutils.version import LooseVersion" if "Loose" in test else "from packaging import version"
    imports = script_head().replace("import argparse\n", f"import argparse\n{spelled}\n").replace("from apex import amp\n", "")
    if gate == "flag":
        return imports + f"use_apex = False\nif {test}:\n    from apex import amp\n    use_apex = True\n"
    return imports + f"if {test}:\n    from apex import amp\n"


def _arms(apex_test: str, apex: list[str], native_test: str, native: list[str], apex_first: bool, plain: list[str] | None) -> list[str]:
    first, second = ((apex_test, apex), (native_test, native)) if apex_first else ((native_test, native), (apex_test, apex))
    lines = [f"if {first[0]}:", *("    " + line for line in first[1]), f"elif {second[0]}:", *("    " + line for line in second[1])]
    if plain is not None:
        lines += ["else:", *("    " + line for line in plain)]
    return lines


def _script(test: str, gate: str, joined: bool, apex_first: bool, holder: str) -> str:
    apex_on = "use_apex" if gate == "flag" else OLD[test]
    apex_test = f"args.steps > 0 and {apex_on}" if joined else apex_on
    body = ["model = torch.nn.Linear(8, 1).to(device)",
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.05)",
            "scaler = torch.cuda.amp.GradScaler(enabled=True)",
            *_arms(apex_test, ["model, optimizer = amp.initialize(model, optimizer, opt_level='O1')"],
                   "not " + apex_on if gate == "flag" else "True", ["pass"], apex_first, None),
            "for step in range(args.steps):",
            "    x = torch.randn(16, 8, device=device)",
            "    with torch.autocast('cuda', enabled=not " + apex_on + ("" if gate == "flag" else "") + "):",
            "        loss = model(x).pow(2).mean()",
            "    optimizer.zero_grad()",
            *("    " + line for line in _arms(
                apex_test, ["with amp.scale_loss(loss, optimizer) as scaled_loss:", "    scaled_loss.backward()",
                            "torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)", "optimizer.step()"],
                "not " + apex_on if gate == "flag" else "True",
                ["scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()"], apex_first, None))]
    if holder == "script":
        return _prelude(OLD[test], gate) + "\n".join(body) + "\n"
    return _prelude(OLD[test], gate) + "\n\ndef main():\n" + "".join(f"    {line}\n" for line in body) + "\n\nmain()\n"


VARIANTS = list(itertools.product(OLD, ("flag", "direct"), (False, True), (False, True), ("script", "function")))


@pytest.mark.parametrize(("test", "gate", "joined", "apex_first", "holder"), VARIANTS)
def test_apex_arms_for_an_old_torch_go_and_the_native_ones_stay(test, gate, joined, apex_first, holder):
    source = _script(test, gate, joined, apex_first, holder)
    result = migrate_source(source, filename="train.py")
    fixed = result.new_source
    assert fixed and "amp." not in fixed.replace("torch.cuda.amp.", "").replace("torch.amp.", ""), fixed
    assert "from apex" not in fixed and "TODO(ampmigrate)" not in fixed, fixed
    ast.parse(fixed)
    assert all(d.fix.applicability.value == "safe" for d in result.diagnostics if d.fix and d.code in ("AMP002", "AMP003", "AMP004"))
    for kept in ("scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()"):
        assert kept in fixed, fixed
    again = migrate_source(fixed, filename="train.py")
    assert again.new_source in (None, fixed)


@pytest.mark.parametrize("change", [
    ("use_apex = True\n", "use_apex = args.steps > 1\n"),  # the flag is also set from elsewhere
    ('version.parse("1.6")', 'version.parse("2.9")'),  # a version the rewrite's torch may be below
    ("use_apex = False\n", "use_apex = False\n\n\ndef enable():\n    global use_apex\n    use_apex = True\n"),
    ("    use_apex = True\n", "    pass\n"),  # never set True: the user's own switch, edited by hand
])
def test_arms_that_may_run_are_not_removed(change):
    source = _script("packaging", "flag", False, False, "script").replace(*change)
    fixed = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source or source
    assert "amp.initialize" in fixed or "GradScaler(\"cuda\"" in fixed, fixed  # planned as apex code that runs, or left


@pytest.mark.slow
def test_the_rewrite_trains_as_the_original_did(tmp_path):
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    source = _script("packaging", "flag", True, False, "script")
    result = compared(tmp_path, source, migrate_source(source, filename="train.py").new_source, "rewritten")
    assert result.verdict == SAME, as_text(result)
