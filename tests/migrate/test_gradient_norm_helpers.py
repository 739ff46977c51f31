"""A project's own gradient-norm function, called at every micro-batch.

The Swin-family training loop takes ``get_grad_norm(amp.master_params(optimizer))`` after each
scaled backward (``if clip: clip_grad_norm_(...) else: get_grad_norm(...)``) and steps every
``accumulation`` micro-batches. apex had unscaled the gradients as ``scale_loss`` exited; natively
they stay scaled until the step, and ``unscale_`` may run once per step. A function whose result
grows exactly as the gradients do (``migrate.grad_norms``) is exact on the scaled gradients
divided by ``scaler.get_scale()``: the safe rewrite does that. Generated functions vary how a
norm is spelled, and mutated ones (a constant added, a square left unrooted, a count, a write to
the gradients) must not be taken for norms: each is run on tensors to say which it is.
"""
from __future__ import annotations

import ast
import shutil
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from migrate.api import migrate_paths
from migrate.grad_norms import defined_norms, is_gradient_norm

torch = pytest.importorskip("torch")

# how the parameters are narrowed to those holding gradients
FILTERS = {
    "filter": "    parameters = list(filter(lambda p: p.grad is not None, parameters))\n",
    "comprehension": "    parameters = [p for p in parameters if p.grad is not None]\n",
    "listed": "    parameters = list(parameters)\n",
}
# how the norm is taken of the narrowed parameters ({order} is the order's name)
BODIES = {
    "loop_item_power": (
        "    {order} = float({order})\n"
        "    total = 0\n"
        "    for p in parameters:\n"
        "        param_norm = p.grad.data.norm({order})\n"
        "        total += param_norm.item() ** {order}\n"
        "    total = total ** (1. / {order})\n"
        "    return total\n"),
    "stacked": (
        "    if len(parameters) == 0:\n"
        "        return torch.tensor(0.)\n"
        "    device = parameters[0].grad.device\n"
        "    if {order} == inf:\n"
        "        total = max(p.grad.detach().abs().max().to(device) for p in parameters)\n"
        "    else:\n"
        "        total = torch.norm(torch.stack([torch.norm(p.grad.detach(), {order}).to(device) for p in parameters]), {order})\n"
        "    return total\n"),
    "squares": (
        "    total = 0.0\n"
        "    for p in parameters:\n"
        "        if p.grad is None:\n"
        "            continue\n"
        "        total += p.grad.pow(2).sum().item()\n"
        "    return total ** 0.5\n"),
    "vector_norm": (
        "    norms = [torch.linalg.vector_norm(p.grad, {order}) for p in parameters]\n"
        "    return torch.linalg.vector_norm(torch.stack(norms), {order}).item()\n"),
}
# what turns a norm into something else, each run below to show it does not grow as the gradients
MUTATIONS = {
    "constant_added": ("    return total\n", "    return total + 1.0\n"),
    "square_kept": ("    total = total ** (1. / {order})\n", ""),
    "count": ("        param_norm = p.grad.data.norm({order})\n", "        param_norm = (p.grad.abs() > 1.0).sum()\n"),
    "written": ("        param_norm = p.grad.data.norm({order})\n",
                "        p.grad.data.mul_(0.5)\n        param_norm = p.grad.data.norm({order})\n"),
    "clamped": ("        param_norm = p.grad.data.norm({order})\n", "        param_norm = p.grad.data.norm({order}).clamp(max=1.0)\n"),
}


def _norm_function(name: str, narrow: str, body: str, order: str = "norm_type") -> str:
    return (f"def {name}(parameters, {order}=2):\n"
            "    if isinstance(parameters, torch.Tensor):\n"
            "        parameters = [parameters]\n"
            + FILTERS[narrow] + BODIES[body].format(order=order))


def _grows_as_the_gradients(source: str, name: str) -> bool:
    """Run the function on gradients and on the same gradients times 1024."""
    space = {"torch": torch, "inf": float("inf")}
    exec(source, space)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(5)
    first = float(space[name](params))
    for p in params:
        p.grad = p.grad * 1024
    return abs(float(space[name](params)) - 1024 * first) <= 1e-4 * 1024 * abs(first)


@settings(max_examples=40, deadline=None)
@given(narrow=st.sampled_from(sorted(FILTERS)), body=st.sampled_from(sorted(BODIES)),
       order=st.sampled_from(["norm_type", "p_norm", "ord"]), name=st.sampled_from(["get_grad_norm", "total_norm", "gn"]))
def test_norms_spelled_every_way_are_found_and_grow_as_the_gradients(narrow, body, order, name):
    if body == "loop_item_power" and order == "p_norm":
        order = "norm_type"  # the loop's own name, `p`, must not be shadowed
    source = _norm_function(name, narrow, body, order)
    assert _grows_as_the_gradients(source, name), source
    assert defined_norms(ast.parse(source)) == {name}, source


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_functions_that_do_not_grow_as_the_gradients_are_not_norms(mutation):
    old, new = MUTATIONS[mutation]
    source = _norm_function("get_grad_norm", "filter", "loop_item_power").replace(old.format(order="norm_type"),
                                                                                  new.format(order="norm_type"))
    assert source != _norm_function("get_grad_norm", "filter", "loop_item_power"), mutation
    grows = _grows_as_the_gradients(source, "get_grad_norm") and mutation != "written"  # a write changes training
    assert not grows, source
    assert not is_gradient_norm(ast.parse(source).body[0]), source


# --- training files calling such a function -----------------------------------------------------

# where the norm function lives and how the training file names it ({f})
LAYOUTS = {
    "from_module": ("helpers.py", "from helpers import get_grad_norm\n", "get_grad_norm"),
    "aliased": ("helpers.py", "from helpers import get_grad_norm as grad_norm_of\n", "grad_norm_of"),
    "package": ("tools/grads.py", "from tools.grads import get_grad_norm\n", "get_grad_norm"),
    "same_file": ("train.py", "", "get_grad_norm"),
    # taken from the package, whose `__init__.py` re-exports it (`PACKAGE_INITS`)
    "reexported": ("tools/grads.py", "from tools import get_grad_norm\n", "get_grad_norm"),
    "reexported_absolute": ("tools/grads.py", "from tools import get_grad_norm\n", "get_grad_norm"),
    "reexported_aliased": ("tools/grads.py", "from tools import grad_norm\n", "grad_norm"),
}
PACKAGE_INITS = {"reexported": "from .grads import get_grad_norm\n",
                 "reexported_absolute": "from tools.grads import get_grad_norm\n",
                 "reexported_aliased": "from .grads import get_grad_norm as grad_norm\n"}
# the norm beside a clip (`if clip: clip_grad_norm_ ... else: norm = f(...)`), or alone
USES = ("else_of_clip", "alone")
BOUNDARIES = ("(index + 1) % accumulation == 0", "index % accumulation == accumulation - 1")
ARGUMENTS = ("", ", 2", ", 2.0")


def _training(layout: str, use: str, boundary: str, params: str, extra: str) -> str:
    _, imports, f = LAYOUTS[layout]
    norm = f"{f}({params}{extra})"
    if use == "else_of_clip":
        read = (f"        if clip:\n            norm = torch.nn.utils.clip_grad_norm_({params}, clip)\n"
                f"        else:\n            norm = {norm}\n")
    else:
        read = f"        norm = {norm}\n"
    own = _norm_function("get_grad_norm", "filter", "loop_item_power") + "\n\n" if layout == "same_file" else ""
    return (
        "import sys\n\nimport torch\nfrom apex import amp\n" + imports + "\n\n" + own +
        "def train(model, optimizer, batches, accumulation, clip, log):\n"
        "    optimizer.zero_grad()\n"
        "    for index, (x, y) in enumerate(batches):\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y) / accumulation\n"
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        + read +
        "        log.write(f'{float(norm):.6e}\\n')\n"
        f"        if {boundary}:\n"
        "            optimizer.step()\n"
        "            optimizer.zero_grad()\n"
        "\n\nif __name__ == '__main__':\n"
        "    torch.manual_seed(0)\n"
        "    device = 'cuda'\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n"
        '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
        "    batches = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(24)]\n"
        "    clip = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0\n"
        "    with open('norms.txt', 'w') as log:\n"
        "        train(model, optimizer, batches, 2, clip, log)\n"
    )


def _project(root: Path, layout: str, use: str, boundary: str, params: str, extra: str, helper: str | None = None) -> Path:
    where = LAYOUTS[layout][0]
    root.mkdir(parents=True, exist_ok=True)
    (root / "setup.py").write_text("")
    if "/" in where:
        (root / "tools").mkdir()
        (root / "tools" / "__init__.py").write_text(PACKAGE_INITS.get(layout, ""))
    if where != "train.py":
        (root / where).write_text("import torch\nfrom math import inf\n\n\n"
                                  + (helper or _norm_function("get_grad_norm", "filter", "stacked")))
    (root / "train.py").write_text(_training(layout, use, boundary, params, extra))
    return root


def _norm_reads(text: str, name: str) -> list[ast.AST]:
    """Each ``name(...)`` call in ``text``, with what it stands in (a division, or the call)."""
    tree = ast.parse(text)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return [parents[id(node)] for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.generate])  # each example migrates a project: no time to shrink
@given(layout=st.sampled_from(sorted(LAYOUTS)), use=st.sampled_from(USES), boundary=st.sampled_from(BOUNDARIES),
       params=st.sampled_from(["amp.master_params(optimizer)", "model.parameters()"]), extra=st.sampled_from(ARGUMENTS))
def test_a_norm_at_every_micro_batch_is_divided_by_the_scale(tmp_path_factory, layout, use, boundary, params, extra):
    root = _project(tmp_path_factory.mktemp("project"), layout, use, boundary, params, extra)
    results = migrate_paths([root])
    assert not any(d.code.startswith("E") for result in results for d in result.diagnostics), results
    training = (root / "train.py").read_text()
    assert "apex" not in training and "TODO(ampmigrate)" not in training, training
    name = LAYOUTS[layout][2]
    reads = _norm_reads(training, name)
    assert reads and all(isinstance(read, ast.BinOp) and isinstance(read.op, ast.Div)
                         and ast.unparse(read.right) == "scaler.get_scale()" for read in reads), training
    assert not any(result.changed for result in migrate_paths([root])), "a second run changed it again"


@pytest.mark.parametrize("mutation", ["constant_added", "square_kept", "count"])
def test_a_function_that_is_not_a_norm_keeps_the_file_on_apex(tmp_path, mutation):
    old, new = MUTATIONS[mutation]
    helper = _norm_function("get_grad_norm", "filter", "loop_item_power").replace(old.format(order="norm_type"),
                                                                                 new.format(order="norm_type"))
    root = _project(tmp_path, "from_module", "alone", BOUNDARIES[0], "amp.master_params(optimizer)", "", helper)
    before = (root / "train.py").read_text()
    migrate_paths([root])
    assert (root / "train.py").read_text() == before
    migrate_paths([root], unsafe_fixes=True)
    assert "TODO(ampmigrate)" in (root / "train.py").read_text()


@pytest.mark.parametrize("order", ["0", "-1", "norm_type"])
def test_a_call_with_an_order_that_is_not_a_positive_number_is_not_divided(tmp_path, order):
    root = _project(tmp_path, "from_module", "alone", BOUNDARIES[0], "amp.master_params(optimizer)", f", {order}")
    before = (root / "train.py").read_text()
    migrate_paths([root])
    assert (root / "train.py").read_text() == before


@pytest.mark.slow
@pytest.mark.parametrize("use, clip", [("alone", "0"), ("else_of_clip", "0"), ("else_of_clip", "0.05")])
def test_the_rewrite_trains_the_same_and_logs_the_same_norms(tmp_path, use, clip):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = _project(tmp_path / "original", "from_module", use, BOUNDARIES[0], "amp.master_params(optimizer)", "")
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    assert "apex" not in (migrated / "train.py").read_text()
    result = compare(Target(str(original / "train.py"), cwd=str(original)), Target(str(migrated / "train.py"), cwd=str(migrated)),
                     [clip], device="cpu", steps=12, parallel=False, timeout=600)
    assert result.verdict == SAME, as_text(result)
    logged = [[float(line) for line in (side / "norms.txt").read_text().split()] for side in (original, migrated)]
    assert len(logged[0]) == len(logged[1]) > 0
    for before, after in zip(*logged):
        assert after == pytest.approx(before, rel=0.02), textwrap.shorten(str(logged), 300)


@pytest.mark.parametrize("use", USES)
def test_the_files_own_norm_is_read_in_a_run_of_that_file_alone(use):
    from migrate.api import migrate_source

    source = _training("same_file", use, BOUNDARIES[0], "amp.master_params(optimizer)", "")
    fixed = migrate_source(source, filename="train.py").new_source
    assert "from apex" not in fixed and "TODO(ampmigrate)" not in fixed, fixed
    assert all(isinstance(read, ast.BinOp) for read in _norm_reads(fixed, "get_grad_norm")), fixed


@pytest.mark.parametrize("layout", sorted(PACKAGE_INITS))
@pytest.mark.parametrize("use", USES)
def test_a_norm_a_package_re_exports_is_divided_by_the_scale(tmp_path, layout, use):
    """``from tools import get_grad_norm``, which ``tools/__init__.py`` takes from ``.grads``: the
    function is read where it is defined."""
    root = _project(tmp_path, layout, use, BOUNDARIES[0], "amp.master_params(optimizer)", "")
    migrate_paths([root])
    training = (root / "train.py").read_text()
    assert "apex" not in training and "TODO(ampmigrate)" not in training, training
    reads = _norm_reads(training, LAYOUTS[layout][2])
    assert reads and all(isinstance(read, ast.BinOp) and ast.unparse(read.right) == "scaler.get_scale()"
                         for read in reads), training
