"""``model, _ = amp.initialize(model, [], ...)``: with no optimizer, what a person writes after the
rewrite is ``model = ...``, not ``model, _ = model.half(), []``; the ``_`` stays where it is read
(alone under O1, which hands the model back as given).
Run after the rewrite: the model is the same object, in float16 where O3 put it there."""
from __future__ import annotations

import pytest
import torch

from migrate.api import migrate_source

SOURCE = """\
import torch
from apex import amp


def run(x):
    {model} = torch.nn.Linear(3, 2)
    {model}, {rest} = amp.initialize({model}, {empty}, opt_level="{level}")
    with torch.no_grad():
        out = {model}(x.to(next({model}.parameters()).dtype))
    return {model}, out{read}{elsewhere}
"""


@pytest.mark.parametrize("level", ["O1", "O3"])
@pytest.mark.parametrize("model", ["model", "waveglow"])
@pytest.mark.parametrize("empty", ["[]", "()"])
@pytest.mark.parametrize("read", [False, True])
@pytest.mark.parametrize("elsewhere", ["", "\n\n\ndef repeat(n):\n    for _ in range(n):\n        pass\n",
                                       "\n\n\ndef shape(x):\n    rows, _ = x.shape\n    return rows\n"])
def test_an_unused_throwaway_for_the_optimizers_goes(level, model, empty, read, elsewhere):
    """``_`` bound elsewhere too (``for _ in range(n)``) but never read: still a throwaway."""
    source = SOURCE.format(model=model, rest="_", empty=empty, level=level, read=", _" if read else "",
                           elsewhere=elsewhere)
    fixed = migrate_source(source, "infer.py", unsafe_fixes=True).new_source
    assert "from apex" not in fixed and "import apex" not in fixed, fixed
    assert (f"{model}, _ = " in fixed) == (read and level == "O3"), fixed
    assert (f"    _ = {empty}\n" in fixed) == (read and level == "O1"), fixed  # O1 hands the model back as given
    if level == "O3":
        assert (f"    {model} = {model}.half()\n" in fixed) != read, fixed
    namespace: dict = {}
    exec(compile(fixed, "fixed.py", "exec"), namespace)
    found = namespace["run"](torch.randn(4, 3))
    assert isinstance(found[0], torch.nn.Linear)
    assert found[0].weight.dtype == (torch.float16 if level == "O3" else torch.float32)


PASSED_THROUGH = """\
import torch
from apex import amp


def setup({params}):
    {targets} = amp.initialize({models}, {optimizer}, opt_level="O1")
    return {returned}
"""


@pytest.mark.parametrize(("targets", "models", "optimizer", "kept"), [
    ("models, optimizer", "[encoder, model]", "optimizer", "models = [encoder, model]"),
    ("[encoder, model], opt", "[encoder, model]", "optimizer", "opt = optimizer"),
    ("self_model, optimizer", "model", "optimizer", "self_model = model"),
    ("model, optimizers", "model", "[opt_a, opt_b]", "optimizers = [opt_a, opt_b]"),
    ("net, opt", "model", "optimizer", "net, opt = model, optimizer"),
])
def test_only_the_part_initialize_renames_is_assigned(targets, models, optimizer, kept):
    """``models, optimizer = amp.initialize([encoder, model], optimizer)`` hands the optimizer back
    as given: what a person writes is ``models = [encoder, model]``, not ``models, optimizer =
    [encoder, model], optimizer``."""
    names = sorted({*targets.replace("[", "").replace("]", "").replace(",", " ").split(),
                    *f"{models} {optimizer}".replace("[", "").replace("]", "").replace(",", " ").split()})
    source = PASSED_THROUGH.format(params=", ".join(names), targets=targets, models=models, optimizer=optimizer,
                                   returned=", ".join(names))
    fixed = migrate_source(source, "setup.py", unsafe_fixes=True).new_source
    assert f"    {kept}\n" in fixed, fixed
    namespace: dict = {}
    exec(compile(fixed, "fixed.py", "exec"), namespace)
    values = {name: object() for name in names}
    expected = dict(values)
    exec(compile(f"{targets} = {models}, {optimizer}", "apex.py", "exec"), {}, expected)  # what O1 handed back
    assert namespace["setup"](**values) == tuple(expected[name] for name in names)


@pytest.mark.parametrize(("targets", "models", "optimizer"), [
    ("(encoder, model), (opt_a, opt_b)", "[encoder, model]", "[opt_a, opt_b]"),
    ("[encoder, model], [opt_a, opt_b]", "(encoder, model)", "[opt_a, opt_b]"),
    ("[model], optimizer", "[model]", "optimizer"),
    ("(self.g, self.d), (self.g_opt, self.d_opt)", "[self.g, self.d]", "[self.g_opt, self.d_opt]"),
])
def test_an_initialize_handing_back_each_place_what_it_holds_goes(targets, models, optimizer):
    """``(g, d), (g_opt, d_opt) = amp.initialize([g, d], [g_opt, d_opt])``: under O1 each name is
    bound again to what it holds, so nothing is left to assign (not ``(g, d), ... = [g, d], ...``)."""
    source = PASSED_THROUGH.format(params="self, encoder, model, optimizer, opt_a, opt_b", targets=targets,
                                   models=models, optimizer=optimizer, returned="model")
    fixed = migrate_source(source, "setup.py", unsafe_fixes=True).new_source
    assert "amp.initialize" not in fixed and _assignments(fixed) == [], fixed


@pytest.mark.parametrize(("targets", "models", "optimizer"), [
    ("(model, encoder), (opt_a, opt_b)", "[encoder, model]", "[opt_a, opt_b]"),  # swapped
    ("models, (opt_a, opt_b)", "[encoder, model]", "[opt_a, opt_b]"),  # the list itself
    ("(encoder, *rest), (opt_a, opt_b)", "[encoder, model]", "[opt_a, opt_b]"),
])
def test_an_initialize_binding_other_places_keeps_its_assignment(targets, models, optimizer):
    source = PASSED_THROUGH.format(params="encoder, model, opt_a, opt_b", targets=targets,
                                   models=models, optimizer=optimizer, returned="model")
    fixed = migrate_source(source, "setup.py", unsafe_fixes=True).new_source
    assert "amp.initialize" not in fixed and _assignments(fixed) == [f"{targets} = {models}, {optimizer}"], fixed


def _assignments(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if " = " in line and not line.strip().startswith("#")]


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("flagged", [False, True])
def test_an_inference_initialize_leaves_one_marker_saying_what_to_do(level, flagged):
    """Its removal is marked once, with the step to take; the unsafe reason saying the same is not
    stacked above it as a second marker."""
    call = f'model, _ = amp.initialize(model, [], opt_level="{level}")'
    body = f"    if amp_run:\n        {call}\n" if flagged else f"    {call}\n"
    source = ("import torch\nfrom apex import amp\n\n\ndef load(model, amp_run):\n" + body
              + "    for _ in range(2):\n        model.eval()\n    return model\n")
    fixed = migrate_source(source, "infer.py", unsafe_fixes=True).new_source
    assert fixed.count("TODO(ampmigrate)") == 1 and "_ = []" not in fixed, fixed
