"""apex's ``amp`` read where no binding of it reaches: ``from apex import amp`` made local to the
function or ``__init__`` that initializes (no ``global amp``), or commented out, while another
function calls ``amp.scale_loss``. Python raised NameError there the first time mixed precision
ran. The plan reads it as apex's module only with ``--unsafe-fixes``, and says so where it
rewrites; the safe run leaves the file and gives that reason, not AMP016's."""
from __future__ import annotations

import itertools
import re
import textwrap

import pytest

from migrate.api import migrate_source

from generated.apex_scripts import Features, script
from test_global_import import SCRIPT as GLOBAL_SCRIPT

# the setup and training functions of the `global amp` shape, with a clip after the scaled backward
FUNCTIONS = GLOBAL_SCRIPT.replace("{import_lines}", "{imports}").replace(
    "                scaled_loss.backward()\n", "                scaled_loss.backward()\n            {clip}\n")

METHODS = """\
import torch


class Trainer:
    def __init__(self, model, optimizer, fp16):
        self.fp16 = fp16
        if fp16:
{imports}
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        self.model, self.optimizer = model, optimizer

    def step(self, inputs, targets):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
        if self.fp16:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            {clip}
        else:
            loss.backward()
        self.optimizer.step()
"""

HOLDERS = {"functions": (FUNCTIONS, 8), "methods": (METHODS, 12)}
IMPORTS = {
    "from-import": "from apex import amp",
    "import as": "import apex.amp as amp",
    "in a try": 'try:\n    from apex import amp\nexcept ImportError:\n    raise ImportError("needs apex")',
    "commented out": "# from apex import amp\npass",
    # the import deleted: the file never says "apex", and is still read as apex's
    "nowhere": "pass",
}
CLIPS = {"no clip": "pass", "master_params clip": "torch.nn.utils.clip_grad_norm_(amp.master_params({opt}), 1.0)"}
FORMS = list(itertools.product(sorted(HOLDERS), sorted(IMPORTS), sorted(CLIPS)))
UNBOUND_READ = re.compile(r"(?<![\w.])amp\.")


def _source(holder: str, imports: str, clip: str) -> str:
    template, indent = HOLDERS[holder]
    opt = "optimizer" if holder == "functions" else "self.optimizer"
    return template.format(imports=textwrap.indent(IMPORTS[imports], " " * indent), clip=CLIPS[clip].format(opt=opt))


@pytest.mark.parametrize(("holder", "imports", "clip"), FORMS)
def test_unsafe_fixes_read_it_as_apex_and_say_so(holder, imports, clip):
    source = _source(holder, imports, clip)
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    fixed = result.new_source
    assert result.changed and not UNBOUND_READ.search(fixed) and "from apex" not in fixed.replace("# from apex", ""), fixed
    assert "apex" in source or imports == "nowhere"
    assert "where no import of it reaches" in fixed and "TODO(ampmigrate)" in fixed, fixed
    assert "scaler.scale(loss).backward()" in fixed and "scaler.step(" in fixed, fixed
    assert "AMP016" not in {d.code for d in result.diagnostics}
    compile(fixed, "train.py", "exec")


@pytest.mark.parametrize(("holder", "imports"), list(itertools.product(sorted(HOLDERS), sorted(IMPORTS))))
def test_the_safe_run_leaves_it_and_gives_the_reason(holder, imports):
    source = _source(holder, imports, "no clip")
    result = migrate_source(source, filename="train.py")
    assert result.new_source == source
    apex = [d for d in result.diagnostics if d.code in ("AMP002", "AMP003")]
    assert apex and not any(d.applied for d in apex), result.diagnostics
    reasons = {d.fix.why_unsafe for d in apex if d.fix is not None}
    expected = "the file imports it nowhere" if imports in ("commented out", "nowhere") else "is local to another function"
    assert any(expected in reason for reason in reasons), reasons
    assert "AMP016" not in {d.code for d in result.diagnostics}


@pytest.mark.parametrize(("change", "said"), [
    # a parameter binds it: what the caller hands over is not seen here
    (("def train(model, optimizer, batches, fp16):", "def train(model, optimizer, batches, fp16, amp=None):"),
     "`amp` is a parameter or local variable here"),
    # a star import may bind it
    (("import torch\n", "import torch\nfrom helpers import *\n"), "`amp` is bound by nothing in this file where it is read"),
    # bound at module level: that binding is what the reads see
    (("import torch\n", "import torch\n\namp = None\n"), "`amp` is a module-level name set at run time, not by an import"),
])
def test_a_name_something_binds_is_not_taken_and_amp016_says_what_binds_it(change, said):
    source = _source("functions", "from-import", "no clip").replace(*change, 1)
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    assert "where no import of it reaches" not in (result.new_source or ""), result.new_source
    assert not any("where no import of it reaches" in (d.fix.why_unsafe or "") for d in result.diagnostics if d.fix)
    assert any(said in d.message for d in result.diagnostics if d.code == "AMP016"), result.diagnostics


def test_an_unbound_name_with_no_apex_only_call_is_not_taken():
    # `state_dict()` and a config-like `initialize()` are not apex's alone
    source = "import torch\n\n\ndef save(model):\n    return {'model': model.state_dict(), 'amp': amp.state_dict()}\n"
    result = migrate_source(source, filename="save.py", unsafe_fixes=True)
    assert result.new_source == source
    assert not any(d.code in ("AMP002", "AMP003", "AMP005") for d in result.diagnostics), result.diagnostics


@pytest.mark.slow
@pytest.mark.parametrize("holder", ["method", "handed"])
def test_the_rewrite_trains_as_the_script_meant(holder, tmp_path):
    """The generated trainer with its ``global amp`` gone (its reads then reach no import) against
    the same trainer with it, which ran: the unsafe rewrite trains as the intended script did."""
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    drawn = Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="master_params",
                     clip_at="boundary", flag="on", import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), holder=holder, import_in="function")
    intended = script(drawn)
    broken = re.sub(r"(?m)^\s*global amp\n", "", intended)
    assert broken != intended
    result = migrate_source(broken, filename="train.py", unsafe_fixes=True)
    assert "where no import of it reaches" in result.new_source, result.new_source
    (tmp_path / "intended.py").write_text(intended)
    (tmp_path / "rewritten.py").write_text(result.new_source)
    for args in ([], ["--no-fp16"]):
        comparison = compare(Target(str(tmp_path / "intended.py")), Target(str(tmp_path / "rewritten.py")), args,
                             device="cpu", steps=30, parallel=True, timeout=240)
        assert comparison.verdict == SAME, as_text(comparison)
