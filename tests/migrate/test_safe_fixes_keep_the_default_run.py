"""Safe fixes never change what a default run computes: shapes where they once did."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from migrate.api import migrate_source
from migrate.apex_plan import HELPER_SOURCE

LEGACY = Path(__file__).resolve().parents[2] / "fixtures" / "legacy"

LOOP = """\
    for x, y in loader:
        loss = criterion(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""


def _migrate(source: str, unsafe_fixes: bool = False):
    result = migrate_source(textwrap.dedent(source), "train.py", unsafe_fixes=unsafe_fixes)
    assert result.error is None, result.error
    return result


def _core(result):
    return [d for d in result.diagnostics if d.code in ("AMP002", "AMP003", "AMP004", "AMP005")]


def test_an_opt_level_defaulting_to_o2_is_not_a_safe_fix_that_stops_the_default_run():
    source = (LEGACY / "train_o2_batchnorm.py").read_text()
    result = migrate_source(source, "train_o2_batchnorm.py")
    assert result.new_source in (None, source)
    reasons = {d.fix.why_unsafe for d in _core(result) if d.fix}
    assert reasons and all("defaults to O2" in reason for reason in reasons)
    unsafe = migrate_source(source, "train_o2_batchnorm.py", unsafe_fixes=True).new_source
    assert "raise RuntimeError" not in unsafe  # unsafe fixes may change precision, never stop the run


def test_a_parameter_named_torch_is_not_read_as_the_module():
    result = _migrate("from apex import amp\n\ndef train(model, optimizer, loader, torch):\n"
                      '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n' + LOOP)
    assert result.new_source in (None, result.source)
    assert all("`torch` names something else" in d.message for d in _core(result))


def test_an_attribute_named_torch_does_not_block_the_rewrite():
    result = _migrate("from apex import amp\n\ndef train(model, optimizer, loader, backend):\n"
                      "    backend.torch = None\n"
                      '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n' + LOOP)
    assert "torch.amp.GradScaler" in result.new_source


def test_a_cast_list_edit_makes_the_rewrite_unsafe_unless_native_autocast_makes_the_same_cast():
    start = "import torch\nfrom apex import amp\n\n{edit}\n\ndef train(model, optimizer, loader):\n" \
            '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
    for edit, safe in [
        ('amp.register_float_function(torch, "sigmoid")', False),
        ('amp.register_half_function(torch, "matmul")', True),
        ('amp.lists.functional_overrides.FP32_FUNCS.remove("softmax")', False),
    ]:
        result = _migrate(start.format(edit=edit) + LOOP)
        safety = {d.fix.applicability.value for d in _core(result)}
        assert safety == ({"safe"} if safe else {"unsafe"}), edit
        if not safe:
            assert "cast lists" in next(iter(_core(result))).fix.why_unsafe
            assert "GradScaler" not in (result.new_source or "")


def test_the_scale_read_from_apex_state_by_key_becomes_the_scalers_scale():
    read = '\n    print(amp.state_dict()["loss_scaler0"]["loss_scale"], amp.state_dict()["loss_scaler0"]["unskipped"])\n'
    result = _migrate('from apex import amp\n\ndef train(model, optimizer, loader):\n'
                      '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n' + LOOP + read)
    assert 'print(scaler.get_scale(), scaler.state_dict()["_growth_tracker"])' in result.new_source
    other = _migrate('from apex import amp\n\ndef train(model, optimizer, loader):\n'
                     '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n' + LOOP
                     + '    print(amp.state_dict()["loss_scaler0"])\n')
    assert other.new_source in (None, other.source)
    assert any("read by key" in d.message for d in _core(other))


def test_the_emitted_helper_names_no_apex_call():
    site = re.compile(r"\bamp\s*\.\s*(initialize|scale_loss|master_params|state_dict|load_state_dict)\s*\(")
    assert not site.search(HELPER_SOURCE)


HANDLERS = ("except ImportError:", "except:", "except Exception:", "except (ImportError, AttributeError):",
            "except BaseException as error:", "except ModuleNotFoundError:")


@pytest.mark.parametrize("handler", HANDLERS)
@pytest.mark.parametrize("flag", ["APEX_AVAILABLE", "apex_support", "IS_AMP_AVAILABLE"])
def test_an_import_fallback_made_dead_is_announced(handler, flag):
    source = """\
        import torch
        try:
            from apex import amp
            {flag} = True
        {handler}
            {flag} = False

        def train(model, optimizer, loader, args):
            if args.fp16 and {flag}:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x, y in loader:
                loss = criterion(model(x), y)
                if args.fp16 and {flag}:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
    """.replace("{flag}", flag).replace("{handler}", handler)
    result = _migrate(source)
    assert handler not in result.new_source
    fixes = [d.fix.message for d in _core(result)]
    assert fixes and all("behaviour change" in fix and f"`{flag} = False`" in fix for fix in fixes)
    # A guard whose import an earlier run removed says the same when it goes.
    left = _migrate("import torch\n\ntry:\n    APEX_AVAILABLE = True\nexcept ImportError:\n    APEX_AVAILABLE = False\n")
    assert left.new_source == "import torch\n"  # the flag, now always True and never read, goes too (AMP018)
    assert "behaviour change" in left.diagnostics[0].message


def test_the_files_own_autocast_inside_the_region_makes_the_rewrite_unsafe():
    result = _migrate("""\
        import torch
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x, y in loader:
            out = model(x)
            with torch.cuda.amp.autocast(enabled=False):
                loss = criterion(out.float(), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """)
    assert result.new_source in (None, result.source)
    reasons = [d.fix.why_unsafe for d in _core(result) if d.fix]
    assert any("own `autocast` at line 7" in reason for reason in reasons), reasons  # at the region
    assert all("own `autocast` at line 7" in reason or "together with the unsafe fix at line 7" in reason
               for reason in reasons), reasons  # the others go with it


APEX_CLIPS_SCALED = """\
import torch
from apex import amp


def train(model, optimizer, loader, args):  # the scaler of the native code is found by name
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = model(x, y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
            if args.clip_value:
                torch.nn.utils.clip_grad_value_(
                    amp.master_params(optimizer), args.clip_value
                )
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_clip_apex_made_inside_scale_loss_stays_on_scaled_gradients_and_a_second_run_changes_nothing():
    # apex unscaled on leaving the block: inside it the clip saw scaled gradients, as it does natively
    # before `scaler.unscale_`; AMP101's safe fix must not unscale them, now or on a later run.
    for source in (APEX_CLIPS_SCALED, APEX_CLIPS_SCALED.replace("  # the scaler of the native code is found by name", "")):
        migrated = _migrate(source).new_source
        assert "unscale_" not in migrated
        lines = migrated.splitlines()
        clip = next(line for line in lines if "clip_grad_norm_(" in line)
        assert clip.endswith("  # noqa: AMP101")
        assert lines[lines.index(clip) - 1].strip() == "# reads scaled gradients, as apex did inside amp.scale_loss"
        # AMP101 makes one finding of the reads after one backward, at the first: one mark there
        # (the `if` holding the second read is one of the finding's related places)
        assert not next(line for line in lines if "if args.clip_value:" in line).endswith("  # noqa: AMP101")
        assert sum("noqa" in line for line in lines) == 1
        second = migrate_source(migrated, "train.py", select=["ALL"])
        assert second.diagnostics == () and second.new_source == migrated
        # the mark removed, AMP101 unscales them, as the user then asks
        unmarked = migrated.replace("  # noqa: AMP101", "")
        assert "scaler.unscale_(optimizer)\n" in migrate_source(unmarked, "train.py").new_source
