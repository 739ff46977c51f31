"""AMP006 on the call form, ``nms = amp.float_function(_C.nms)``: the rewrite defines ``nms``
casting the floating-point CUDA inputs where autocast is on, then calling the wrapped function,
as apex's wrapper did where O1 was on. Judged by running the rewritten module: the inputs the
wrapped function receives, with autocast off (on the CPU) and on (on a GPU)."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

torch = pytest.importorskip("torch")

SOURCE = '''from apex import amp


def kernel(boxes, scores, threshold=0.5):
    seen.append((boxes.dtype, scores.dtype, threshold))
    return boxes


seen = []
nms = amp.{cast}(kernel)
'''


def _migrated(cast: str) -> dict:
    result = migrate_source(SOURCE.format(cast=cast), filename="nms.py")
    assert "from apex" not in result.new_source, result.new_source
    namespace: dict = {}
    exec(compile(result.new_source, "nms.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("cast", ["float_function", "half_function", "bfloat16_function"])
def test_the_wrapper_passes_inputs_through_where_autocast_is_off(cast):
    module = _migrated(cast)
    boxes, scores = torch.ones(2, 4, dtype=torch.float16), torch.ones(2)
    assert module["nms"](boxes, scores=scores, threshold=0.7) is boxes
    assert module["seen"] == [(torch.float16, torch.float32, 0.7)]


def test_promote_function_is_only_reported():
    source = SOURCE.format(cast="promote_function")
    result = migrate_source(source, filename="nms.py", unsafe_fixes=True)
    assert result.new_source == source and any(d.code == "AMP006" for d in result.diagnostics)


@pytest.mark.cuda
@pytest.mark.parametrize("cast, dtype", [("float_function", torch.float32), ("half_function", torch.float16)])
def test_the_wrapper_casts_cuda_inputs_under_autocast(cast, dtype):
    module = _migrated(cast)
    boxes = torch.ones(2, 4, device="cuda", dtype=torch.float16 if dtype == torch.float32 else torch.float32)
    with torch.autocast("cuda", dtype=torch.float16):
        module["nms"](boxes, scores=boxes[:, 0])
    assert module["seen"] == [(dtype, dtype, 0.5)]
