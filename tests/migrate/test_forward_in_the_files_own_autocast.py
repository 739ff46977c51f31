"""A native path beside apex's whose own autocast holds the forward, the loss and apex's scaled
backward alike (``with torch.cuda.amp.autocast(enabled=backend == "native"):`` around the whole
step). A region of the rewrite inside it, off where the GradScaler is, would switch the file's
own off on the native path (its forward then in float32): the file's own region is turned on
also where the scaler is, once, whatever is computed in it. Where the file's own region has no
``enabled=`` to widen, the rewrite is unsafe and says why.
"""
from __future__ import annotations

import itertools

import pytest

from ampshim.compare import DIFFERS, SAME
from generated.small_scripts import compared, script_head
from migrate.api import migrate_source

OWN_REGIONS = {
    "cuda_amp": ("", "torch.cuda.amp.autocast({enabled})"),
    "autocast_cuda": ("", 'torch.autocast("cuda", {enabled})'),
    "amp_autocast": ("", 'torch.amp.autocast(device_type="cuda", {enabled})'),
    "imported": ("from torch.cuda.amp import autocast\n", "autocast({enabled})"),
}


def _script(region: str, accumulate: bool, enabled: str = 'enabled=args.backend == "native"') -> str:
    imports, call = OWN_REGIONS[region]
    divide = "        loss = loss / 2\n" if accumulate else ""
    return (script_head('parser.add_argument("--backend", default="apex")\n').replace("from apex import amp\n", imports + "from apex import amp\n")
            + "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            'if args.backend == "apex":\n'
            '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
            "x, y = torch.randn(64, 8, device=device), torch.randn(64, 1, device=device)\n"
            "for step in range(args.steps):\n"
            "    optimizer.zero_grad()\n"
            f"    with {call.format(enabled=enabled)}:\n"
            "        out = model(x)\n"
            "        loss = F.mse_loss(out, y)\n"
            f"{divide}"
            '        if args.backend == "apex":\n'
            "            with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
            "                scaled_loss.backward()\n"
            "        else:\n"
            "            loss.backward()\n"
            "        optimizer.step()\n")


@pytest.mark.parametrize("region, accumulate", list(itertools.product(OWN_REGIONS, [False, True])))
def test_the_files_own_region_is_turned_on_where_the_scaler_is(region, accumulate):
    result = migrate_source(_script(region, accumulate), "train.py")
    new = result.new_source
    assert new is not None and "amp." not in new.replace("torch.amp.", "").replace("torch.cuda.amp.", ""), new
    own = OWN_REGIONS[region][1].format(enabled='enabled=(args.backend == "native") or scaler.is_enabled()')
    # as the formatter lays out a long head: compared without the whitespace
    assert "".join(f"with {own}: out = model(x)".split()) in "".join(new.split()), new
    assert new.count("autocast(") == 1, new  # no second region inside it, for the forward or the division


@pytest.mark.parametrize("region", OWN_REGIONS)
def test_an_own_region_with_nothing_to_widen_is_unsafe(region):
    """``autocast()`` always on, around apex's flagged path: a region inside it, off with the
    flag, would switch it off; the file is left as it is, with the reason."""
    result = migrate_source(_script(region, False, enabled="").replace(", )", ")").replace("(, ", "("), "train.py")
    assert result.new_source in (None, result.source)
    reasons = [d.fix.why_unsafe for d in result.diagnostics if d.fix and d.fix.why_unsafe]
    assert any("holds the forward" in reason for reason in reasons), reasons


@pytest.mark.slow
def test_the_widened_region_keeps_the_native_paths_half_forward(tmp_path):
    """On the native path the file's own region stays on (a region of ours inside it had switched
    it off: "forward left in float32")."""
    original = _script("cuda_amp", True)
    result = migrate_source(original, "train.py")
    outcome = compared(tmp_path, original, result.new_source, "safe", args=("--backend", "native"))
    assert outcome.verdict == SAME, outcome


@pytest.mark.slow
def test_on_apexs_path_the_rewrite_casts_as_apex_did_where_ampshim_does_not(tmp_path):
    """apex's O1 patched functions cast whatever native autocast said, so under the file's own
    ``autocast(enabled=False)`` its forward ran in half, as the widened region's does; ampshim's
    O1 is native autocast, which that region switches off (docs/compatibility.md). compare, run
    against ampshim, names exactly that difference and no other."""
    original = _script("cuda_amp", True)
    result = migrate_source(original, "train.py")
    outcome = compared(tmp_path, original, result.new_source, "safe", args=("--backend", "apex"))
    assert outcome.verdict == DIFFERS and outcome.difference.cause == "forward-precision", outcome
    assert "in half precision where the original's is not" in outcome.difference.message, outcome
