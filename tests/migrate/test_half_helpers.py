"""A model handed to a function of another file that casts modules to float16 (``model.apply(
set_bn_eval)`` where ``set_bn_eval`` does ``m.eval().half()`` on each BatchNorm): their gradients
are float16, which apex O1 stepped and ``GradScaler.unscale_`` refuses. Not rewritten, even
unsafely: the first step would raise."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from migrate.api import migrate_paths

TRAIN = textwrap.dedent("""\
    import torch
    from apex import amp

    from {module} import {imported}


    def train(model, optimizer, batches):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        {handed}
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
""")
CASTS = {
    "half": "def set_bn_eval(m):\n    if 'BatchNorm' in type(m).__name__:\n        m.eval().half()\n",
    "to float16": "import torch\n\n\ndef set_bn_eval(m):\n    if isinstance(m, torch.nn.BatchNorm2d):\n        m.to(torch.float16)\n",
    "to dtype": "import torch\n\n\ndef set_bn_eval(module):\n    for m in module.modules():\n        m.to(dtype=torch.half)\n",
}
HANDED = {"apply": "model.apply({name})", "called": "{name}(model)"}


def _project(root: Path, casts: str, handed: str, alias: bool, module: str = "utils.util") -> Path:
    (root / ".git").mkdir(parents=True)
    (root / "utils").mkdir()
    (root / "utils" / "__init__.py").write_text("")
    (root / "utils" / "util.py").write_text(casts)
    name = "bn_eval" if alias else "set_bn_eval"
    imported = "set_bn_eval as bn_eval" if alias else "set_bn_eval"
    train = TRAIN.format(module=module, imported=imported, handed=HANDED[handed].format(name=name))
    (root / "train.py").write_text(train)
    return root / "train.py"


@pytest.mark.parametrize("alias", [False, True])
@pytest.mark.parametrize("handed", sorted(HANDED))
@pytest.mark.parametrize("casts", sorted(CASTS))
def test_a_model_handed_to_a_function_casting_modules_to_half_is_not_rewritten(tmp_path, casts, handed, alias):
    train = _project(tmp_path, CASTS[casts], handed, alias)
    source = train.read_text()
    for unsafe in (False, True):
        [result] = [r for r in migrate_paths([train], write=False, unsafe_fixes=unsafe) if r.filename.endswith("train.py")]
        assert result.new_source in (None, source), result.new_source
        messages = " ".join(d.message for d in result.diagnostics if d.code == "AMP002")
        assert "casts modules to float16" in messages and "util.py:" in messages, messages


def test_a_function_that_casts_nothing_to_half_leaves_the_rewrite_alone(tmp_path):
    train = _project(tmp_path, "def set_bn_eval(m):\n    m.eval()\n", "apply", False)
    [result] = [r for r in migrate_paths([train], write=False) if r.filename.endswith("train.py")]
    assert result.new_source and "amp.initialize" not in result.new_source, result.new_source
