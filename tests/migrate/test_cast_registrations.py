"""An apex cast registration in another file of the project makes a file's initialize rewrite unsafe."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from migrate.api import migrate_paths
from migrate.types import Safety

_TRAIN = textwrap.dedent("""\
    import torch
    from apex import amp

    from models.heads import Head


    def main(model, optimizer, loader, epochs):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for epoch in range(epochs):
            for batch in loader:
                loss = Head()(model(batch)).mean()
                with amp.scale_loss(loss, optimizer) as scaled:
                    scaled.backward()
                optimizer.step()
                optimizer.zero_grad()
""")

_HEADS = """\
import torch
{imports}

{registration}


class Head(torch.nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)
"""


def _project(root: Path, registration: str, imports: str = "from apex import amp") -> Path:
    (root / ".git").mkdir(parents=True)
    (root / "models").mkdir()
    (root / "models" / "__init__.py").write_text("")
    (root / "models" / "heads.py").write_text(_HEADS.format(imports=imports, registration=registration))
    (root / "train.py").write_text(_TRAIN)
    return root / "train.py"


def _initialize_safety(results, train: Path):
    result = next(r for r in results if Path(r.filename).name == train.name)
    return result, {d.fix.applicability for d in result.diagnostics if d.fix is not None and d.code == "AMP002"}


@pytest.mark.parametrize("given", ["project", "file"])
def test_a_registration_native_autocast_does_not_make_makes_the_rewrite_unsafe(tmp_path, given):
    train = _project(tmp_path, 'amp.register_float_function(torch, "sigmoid")')
    results = migrate_paths([tmp_path if given == "project" else train], write=False)
    _, safety = _initialize_safety(results, train)
    assert safety == {Safety.UNSAFE}
    unsafe = migrate_paths([tmp_path if given == "project" else train], write=False, unsafe_fixes=True)
    rewritten = next(r for r in unsafe if Path(r.filename).name == train.name).new_source
    assert "TODO(ampmigrate)" in rewritten and "changes apex's cast lists (models/heads.py:4)" in " ".join(
        line.strip("# ") for line in rewritten.splitlines())


@pytest.mark.parametrize("registration", [
    'amp.register_half_function(torch, "matmul")',  # native autocast runs it in float16 too
    "",  # nothing registered
])
def test_no_registration_or_a_native_one_keeps_the_rewrite_safe(tmp_path, registration):
    train = _project(tmp_path, registration)
    _, safety = _initialize_safety(migrate_paths([tmp_path], write=False), train)
    assert safety == {Safety.SAFE}


def test_a_project_of_its_own_inside_the_folder_is_not_searched(tmp_path):
    """A file with no project markers above it has its folder for a project; a clone inside that
    folder (its own ``.git``) is another project."""
    (tmp_path / "loose.py").write_text(_TRAIN.replace("from models.heads import Head\n", ""))
    _project(tmp_path / "clone", 'amp.register_float_function(torch, "sigmoid")')
    _, safety = _initialize_safety(migrate_paths([tmp_path / "loose.py"], write=False), tmp_path / "loose.py")
    assert safety == {Safety.SAFE}


@pytest.mark.parametrize("calls", [("float",), ("float", "float"), ("float", "float", "float"), ("float", "half", "float"),
                                   ("half", "float", "half", "float")])
def test_one_reason_names_every_line_of_the_same_registration(calls):
    """``amp.register_float_function`` three times is one reason with three lines, not three reasons."""
    from migrate.api import migrate_source

    registered = "".join(f'    amp.register_{kind}_function(torch, "op{index}")\n' for index, kind in enumerate(calls))
    source = _TRAIN.replace("    model, optimizer = amp.initialize", registered + "    model, optimizer = amp.initialize")
    why = " ".join(d.fix.why_unsafe for d in migrate_source(source, filename="train.py").diagnostics if d.fix and d.fix.why_unsafe)
    for kind in set(calls):
        lines = [str(8 + index) for index, each in enumerate(calls) if each == kind]
        named = f"line{'s' if len(lines) > 1 else ''} {', '.join(lines)}"
        assert why.count(f"(`amp.register_{kind}_function`, {named}):") >= 1, why
        assert why.count(f"(`amp.register_{kind}_function`, line") == why.count(f"(`amp.register_{kind}_function`, {named})"), why
