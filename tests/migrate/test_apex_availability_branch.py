"""``try: from apex import amp / except ImportError: amp = None``, then a test of ``amp`` choosing
between apex's path and a fallback for runs without apex (``if amp is None: <warn, O0> else:
<initialize>``). Once the rest of the file is migrated nothing else uses apex's module, and native
torch.amp needs no install: apex's arm takes the test's place and the import goes (a behaviour
change where apex was not installed, said in the fix). Spelled every way the test can be (``is
None``, ``not``, ``is not None``, bare), apex's arm in the body or the ``else:``, with or without
the fallback; where ``amp`` is still read elsewhere, or another binding of it exists, or the test
is an ``elif``, it stays an availability check. One runs through ``compare``."""
from __future__ import annotations

import itertools

import pytest

from ampshim.compare import SAME
from generated.small_scripts import compared
from migrate.api import migrate_source

FALLBACK = ['print("apex is not installed: fp32")', 'args.opt_level = "O0"']
APEX_ARM = ['model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)']
# the test, and whether its body is apex's arm
TESTS = {"is_none": ("amp is None", False), "not": ("not amp", False),
         "is_not_none": ("amp is not None", True), "bare": ("amp", True),
         "equals_none": ("amp == None", False)}


def _block(lines: list[str], depth: int) -> str:
    return "".join("    " * depth + line + "\n" for line in lines)


def _script(test: str, with_fallback: bool, extra_read: str = "") -> str:
    condition, body_is_apex = TESTS[test]
    if body_is_apex:
        arms = [f"if {condition}:", *_block(APEX_ARM, 1).splitlines()]
        arms += ["else:", *_block(FALLBACK, 1).splitlines()] if with_fallback else []
    else:
        arms = [f"if {condition}:", *_block(FALLBACK, 1).splitlines(), "else:", *_block(APEX_ARM, 1).splitlines()]
    return ("import argparse\n\nimport torch\nimport torch.nn.functional as F\n\n"
            "try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n\n\n"
            "def train(args, model, optimizer, x, y):\n"
            "    for step in range(args.steps):\n"
            "        optimizer.zero_grad()\n"
            "        loss = F.mse_loss(model(x), y)\n"
            '        if args.opt_level != "O0":\n'
            "            with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
            "                scaled_loss.backward()\n"
            "        else:\n"
            "            loss.backward()\n"
            "        optimizer.step()\n\n\n"
            "def main():\n"
            "    parser = argparse.ArgumentParser()\n"
            '    parser.add_argument("--steps", type=int, default=30)\n'
            '    parser.add_argument("--opt-level", default="O1")\n'
            "    args = parser.parse_args()\n"
            '    torch.manual_seed(0)\n    device = "cuda"\n'
            "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            '    if args.opt_level != "O0":\n'
            + _block(arms, 2) + extra_read
            + "    x, y = torch.randn(64, 8, device=device), torch.randn(64, 1, device=device)\n"
            "    train(args, model, optimizer, x, y)\n\n\n"
            'if __name__ == "__main__":\n    main()\n')


@pytest.mark.parametrize("test, with_fallback", list(itertools.product(TESTS, [True, False])))
def test_apexs_arm_takes_the_tests_place(test, with_fallback):
    if not TESTS[test][1] and not with_fallback:
        pytest.skip("apex's arm is the else: the fallback is always there")
    result = migrate_source(_script(test, with_fallback), "train.py")
    new = result.new_source
    assert new is not None and "apex is not installed" not in new, new  # the fallback arm went
    assert "from apex import" not in new and "amp = None" not in new and "amp is" not in new, new
    assert "if amp" not in new and "if not amp" not in new and "bool(amp)" not in new and "amp ==" not in new, new
    assert "        pass\n" not in new, new  # an arm the rewrite emptied goes with the test
    compile(new, "train.py", "exec")
    notes = " ".join(d.fix.message for d in result.diagnostics if d.fix)
    assert "where apex was not installed" in notes, notes


@pytest.mark.parametrize("test", ["amp is not None", "amp", "not amp is None"])
def test_a_conditional_expression_takes_apexs_value(test):
    extra = f'    args.opt_level = args.opt_level if {test} else "O0"\n'
    result = migrate_source(_script("bare", True, extra_read=extra), "train.py")
    new = result.new_source
    assert new is not None and "args.opt_level = args.opt_level\n" in new and '"O0"\n' not in new.split("opt_level =")[-1], new
    assert "from apex import" not in new and "amp = None" not in new, new


@pytest.mark.parametrize("shape", ["read_elsewhere", "elif", "rebound"])
def test_an_availability_check_that_is_not_alone_stays(shape):
    source = _script("is_none", True)
    if shape == "read_elsewhere":  # apex's module still read: a log of its version
        source = source.replace("    train(args, model, optimizer, x, y)\n", "    print(amp)\n    train(args, model, optimizer, x, y)\n")
    elif shape == "elif":
        source = source.replace("        if amp is None:\n", "        if args.steps == 0:\n            pass\n        elif amp is None:\n")
    else:  # bound to something else too
        source = source.replace("    amp = None\n", "    amp = object()\n")
    result = migrate_source(source, "train.py")
    new = result.new_source or source
    assert "amp is None" in new, new
    messages = " ".join(d.message for d in result.diagnostics)
    assert "availability check" in messages or "amp" in new, messages


@pytest.mark.slow
@pytest.mark.parametrize("test", ["is_none", "bare"])
def test_apexs_arm_kept_trains_as_apex_did(test, tmp_path):
    original = _script(test, True)
    rewritten = migrate_source(original, "train.py").new_source
    assert "from apex import" not in rewritten, rewritten
    outcome = compared(tmp_path, original, rewritten, "safe")
    assert outcome.verdict == SAME, outcome
