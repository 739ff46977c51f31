"""``model, _ = amp.initialize(model, [], ...)``: with no optimizer, what a person writes after the
rewrite is ``model = ...``, not ``model, _ = model.half(), []``; the ``_`` stays where it is read.
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
    return {model}, out{read}
"""


@pytest.mark.parametrize("level", ["O1", "O3"])
@pytest.mark.parametrize("model", ["model", "waveglow"])
@pytest.mark.parametrize("empty", ["[]", "()"])
@pytest.mark.parametrize("read", [False, True])
def test_an_unused_throwaway_for_the_optimizers_goes(level, model, empty, read):
    source = SOURCE.format(model=model, rest="_", empty=empty, level=level, read=", _" if read else "")
    fixed = migrate_source(source, "infer.py", unsafe_fixes=True).new_source
    assert "from apex" not in fixed and "import apex" not in fixed, fixed
    assert (f"{model}, _ = " in fixed) == read, fixed
    if level == "O3":
        assert (f"    {model} = {model}.half()\n" in fixed) != read, fixed
    namespace: dict = {}
    exec(compile(fixed, "fixed.py", "exec"), namespace)
    found = namespace["run"](torch.randn(4, 3))
    assert isinstance(found[0], torch.nn.Linear)
    assert found[0].weight.dtype == (torch.float16 if level == "O3" else torch.float32)
