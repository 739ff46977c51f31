"""A batch skipped before its scaled backward pass on a test that calls something (``if
torch.isnan(loss).any(): skip``), the optimizer's step after it: the step goes through the scaler
where the optimizer holds gradients, plainly else, as apex's patched step did.

That test is the same question as "did a scaled backward pass run" where nothing else gives the
optimizer gradients: every ``zero_grad()`` leaves None, one clears what ``initialize`` was given,
and every other backward pass runs only where the scaler is off or has its gradients cleared
right after it (a warm-up pass that allocates memory). There it is safe; elsewhere unsafe."""
from __future__ import annotations

import itertools

import pytest

from generated.small_scripts import compared, script_head
from migrate.api import migrate_source

PRELUDE = script_head(imports=("math",)) + """\
data = torch.randn(64, 8, device=device)
target = torch.randn(64, 1, device=device)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
"""

WARM_UP = """\
for size in (4, 8):  # warm-up passes: memory for each batch size, their gradients dropped
    warm = F.mse_loss(model(torch.zeros(size, 8, device=device)), torch.zeros(size, 1, device=device))
    warm.backward()
    {clear}
"""

TESTS = {  # the skip, as trainers spell it
    "isnan": "torch.isnan(loss).any()",
    "isfinite": "not torch.isfinite(loss).all()",
    "math": "not math.isfinite(loss.item())",
}


def _script(test: str, skipped_in: str, accumulate: bool, clear: str | None, warm_up: str | None, other_arm: str = "skip") -> str:
    body = ["start = (step * 16) % 64",
            "loss = F.mse_loss(model(data[start:start + 16]), target[start:start + 16])",
            "if step % 5 == 4:",
            '    loss = loss * float("nan")  # a bad batch: skipped before its backward pass']
    if clear is not None and not accumulate:
        body.append(clear)
    elif clear is not None:
        body += ["if step % 2 == 0:", f"    {clear}"]
    scaled = ["with amp.scale_loss(loss, optimizer) as scaled_loss:", "    scaled_loss.backward()"]
    skip = {"skip": ["print('skipping a bad batch')"], "plain": ["(loss * 0).nan_to_num().backward()"],
            "by hand": ["for p in model.parameters():", "    p.grad = torch.zeros_like(p)"]}[other_arm]
    if skipped_in == "if":
        body += [f"if {TESTS[test]}:", *("    " + line for line in skip), "else:", *("    " + line for line in scaled)]
    else:  # the backward pass under the negated test, no else
        negated = TESTS[test][4:] if TESTS[test].startswith("not ") else f"not {TESTS[test]}"
        body += [f"if {negated}:", *("    " + line for line in scaled)]
        if other_arm != "skip":
            body += ["else:", *("    " + line for line in skip)]
    body += ["if step % 2 == 1:" if accumulate else "if True:", "    optimizer.step()"]
    loop = "for step in range(args.steps):\n" + "".join(f"    {line}\n" for line in body)
    warm = WARM_UP.format(clear=warm_up) if warm_up is not None else ""
    return PRELUDE + warm + loop


SAFE = list(itertools.product(TESTS, ("if", "negated"), (False, True),
                              ("optimizer.zero_grad()", "model.zero_grad()", "optimizer.zero_grad(set_to_none=True)"),
                              (None, "model.zero_grad()", "optimizer.zero_grad()")))


@pytest.mark.parametrize(("test", "skipped_in", "accumulate", "clear", "warm_up"), SAFE)
def test_the_step_after_a_skippable_backward_is_safe_where_only_it_gives_gradients(test, skipped_in, accumulate, clear, warm_up):
    source = _script(test, skipped_in, accumulate, clear, warm_up)
    result = migrate_source(source, filename="train.py")
    fixed = result.new_source
    assert fixed and "from apex" not in fixed and "TODO(ampmigrate)" not in fixed, fixed
    assert 'any(p.grad is not None for group in optimizer.param_groups for p in group["params"])' in fixed, fixed
    assert "scaler.step(optimizer)" in fixed and "    optimizer.step()  # noqa: AMP102" in fixed, fixed
    again = migrate_source(fixed, filename="train.py")
    assert again.new_source in (None, fixed)


@pytest.mark.parametrize(("clear", "warm_up", "other_arm", "why"), [
    ("optimizer.zero_grad(set_to_none=False)", None, "skip", "zeros"),  # zeros, not None: the guard holds after a skip
    ("optimizer.zero_grad(False)", None, "skip", "zeros"),
    (None, None, "skip", "no clear"),  # gradients from an earlier step would be unscaled twice
    ("optimizer.zero_grad()", "pass", "skip", "warm-up kept"),  # the warm-up's gradients reach the first step
    ("optimizer.zero_grad()", "teacher.zero_grad()", "skip", "another model cleared"),
    ("optimizer.zero_grad()", None, "plain", "a plain backward in the other arm"),
    ("optimizer.zero_grad()", None, "by hand", "gradients written by hand in the other arm"),
])
def test_the_step_after_a_skippable_backward_stays_unsafe_where_something_else_gives_gradients(clear, warm_up, other_arm, why):
    source = _script("isnan", "if", False, clear, warm_up, other_arm)
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    reasons = " ".join(d.fix.why_unsafe or "" for d in result.diagnostics if d.fix)
    assert "test that calls something" in reasons or "plain backward pass" in reasons, (why, reasons)
    # the guard's reason is the one kept where nothing else makes the rewrite unsafe
    assert other_arm == "plain" or "test that calls something" in reasons, (why, reasons)
    assert migrate_source(source, filename="train.py").new_source in (None, source), why


@pytest.mark.slow
@pytest.mark.parametrize(("test", "skipped_in", "accumulate", "clear", "warm_up"), [
    ("isnan", "if", False, "optimizer.zero_grad()", "model.zero_grad()"),
    ("isfinite", "negated", True, "model.zero_grad()", None),
])
def test_the_rewrite_of_a_skipping_loop_trains_as_apex_did(test, skipped_in, accumulate, clear, warm_up, tmp_path):
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    source = _script(test, skipped_in, accumulate, clear, warm_up)
    kept = compared(tmp_path, source, migrate_source(source, filename="train.py").new_source, "rewritten")
    assert kept.verdict == SAME, as_text(kept)
