"""AMP008 goes with the file's ``amp.initialize``. While apex still initializes there (its
``initialize`` not rewritten), apex's patched functions cast inside a disabled ``torch.autocast``
too, so ``amp.disable_casts()`` stays, reported; where the ``initialize`` rewrite is unsafe, so is
this one; where it is safe, or the file initializes nothing, the call becomes a disabled autocast.
An adversarial-training script kept ``amp.initialize`` and lost its ``disable_casts`` around the
final float32 evaluation. Over the ways the call is used and the ways ``initialize`` is written."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source
from migrate.types import Safety

USES = {
    "with": "    with amp.disable_casts():\n        y = model(x.float())\n",
    "chosen": "    context = amp.disable_casts() if half else contextlib.nullcontext()\n    with context:\n        y = model(x.float())\n",
    "joined": "    with torch.no_grad(), amp.disable_casts():\n        y = model(x.float())\n",
}
# how `initialize` is written, and what becomes of it: kept (not rewritten), unsafe, safe, none in the file
INITIALIZE = {
    "kept": "model, optimizer = amp.initialize(model, optimizer, *extra)\n",
    "unsafe": 'model, optimizer = amp.initialize(model, optimizer, opt_level="O2")\n',
    "safe": 'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n',
    "none": "",
}
STEP = ("for x, target in loader:\n    loss = model(x).sum()\n"
        "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n        scaled_loss.backward()\n    optimizer.step()\n")


def _source(use: str, initialize: str) -> str:
    body = INITIALIZE[initialize] + (STEP if initialize != "none" else "")
    return ("import contextlib\n\nimport torch\nfrom apex import amp\n\n" + body
            + "\n\ndef evaluate(model, x, half):\n" + USES[use] + "    return y\n")


@pytest.mark.parametrize("use, initialize, unsafe_fixes", list(itertools.product(USES, INITIALIZE, [False, True])))
def test_disable_casts_changes_only_with_apexs_initialize(use, initialize, unsafe_fixes):
    result = migrate_source(_source(use, initialize), "train.py", unsafe_fixes=unsafe_fixes)
    new = result.new_source or _source(use, initialize)
    replaced = initialize in ("safe", "none") or (initialize == "unsafe" and unsafe_fixes)
    assert ("amp.disable_casts()" not in new) is replaced, new
    assert ('torch.autocast("cuda", enabled=False)' in new) is replaced, new
    compile(new, "train.py", "exec")
    said = [d for d in result.diagnostics if d.code == "AMP008"]
    if initialize == "kept":
        assert said and "apex still initializes" in said[0].message, [d.message for d in said]
    if initialize == "unsafe" and not unsafe_fixes:
        assert said and said[0].fix is not None and said[0].fix.applicability is Safety.UNSAFE, said
        assert "whose rewrite is unsafe" in said[0].fix.why_unsafe, said[0].fix
