"""Lines a fix writes past the file's limit are laid out over several lines, code unchanged."""
from __future__ import annotations

import ast
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from migrate.api import migrate_source
from migrate.line_wrap import fit_new_lines


def _fit(code: str, limit: int = 88) -> str:
    after = textwrap.dedent(code)
    fitted = fit_new_lines("", after, limit)
    assert ast.dump(ast.parse(fitted)) == ast.dump(ast.parse(after))
    return fitted


def test_a_call_grown_past_the_limit_puts_its_arguments_on_a_line_of_their_own():
    fitted = _fit("""\
        if distributed:
            self.generator_model = torch.nn.parallel.DistributedDataParallel(self.generator_model, find_unused_parameters=True)
    """)
    assert fitted == textwrap.dedent("""\
        if distributed:
            self.generator_model = torch.nn.parallel.DistributedDataParallel(
                self.generator_model, find_unused_parameters=True
            )
    """)


def test_arguments_that_do_not_fit_on_one_line_go_one_a_line_with_a_trailing_comma():
    fitted = _fit("opt = torch.optim.AdamW(groups, lr=config.learning_rate, weight_decay=config.weight_decay, "
                  "betas=(config.beta1, config.beta2), eps=config.eps, fused=True)\n")
    assert fitted.splitlines() == [
        "opt = torch.optim.AdamW(",
        "    groups,",
        "    lr=config.learning_rate,",
        "    weight_decay=config.weight_decay,",
        "    betas=(config.beta1, config.beta2),",
        "    eps=config.eps,",
        "    fused=True,",
        ")",
    ]


def test_a_conditioned_scale_factor_splits_at_its_if_else_and_its_and():
    fitted = _fit("""\
        def clip(cfg, scaler, model):
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_norm * (scaler.get_scale() if getattr(cfg, "mixed_precision_backend", None) == "amp" and not cfg.deepspeed_enabled else 1.0))
    """)
    assert fitted.splitlines()[1:] == [
        "    torch.nn.utils.clip_grad_norm_(",
        "        model.parameters(),",
        "        cfg.max_norm * (",
        "            scaler.get_scale()",
        '            if getattr(cfg, "mixed_precision_backend", None) == "amp"',
        "            and not cfg.deepspeed_enabled",
        "            else 1.0",
        "        ),",
        "    )",
    ]


def test_a_long_condition_goes_in_parentheses_one_operand_a_line():
    fitted = _fit("""\
        for batch in loader:
            if step % config.gradient_accumulation_steps == 0 and global_step % config.logging_steps == 0:
                log(step)
    """)
    assert fitted.splitlines()[1:5] == [
        "    if (",
        "        step % config.gradient_accumulation_steps == 0",
        "        and global_step % config.logging_steps == 0",
        "    ):",
    ]


def test_a_comprehension_splits_before_its_for_and_if():
    fitted = _fit("total_norm = sum(parameter.grad.norm() for group in optimizer.param_groups for parameter in group['params'] "
                  "if parameter.grad is not None)\n")
    assert fitted.splitlines() == [
        "total_norm = sum(",
        "    parameter.grad.norm()",
        "    for group in optimizer.param_groups",
        "    for parameter in group['params']",
        "    if parameter.grad is not None",
        ")",
    ]


def test_a_trailing_comment_stays_on_the_statement_s_first_line():
    fitted = _fit("torch.nn.utils.clip_grad_norm_(amp_free_parameters_of_the_model, configured_maximum_norm_value)"
                  "  # noqa: AMP101\n")
    assert fitted.splitlines()[0] == "torch.nn.utils.clip_grad_norm_(  # noqa: AMP101"


def test_braces_inside_an_f_string_are_not_split_points():
    string = 'f"{epoch_number_of_this_run}/{total_epochs_configured_for_training}: {running_loss_value:.4f} {lr}"'
    assert _fit(f"print({string})\n").splitlines() == ["print(", f"    {string}", ")"]


def test_lines_the_original_had_are_left_as_they_were():
    line = "model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)\n"
    assert fit_new_lines(line, line, 88) == line


def test_a_line_that_is_not_whole_by_itself_is_left_as_it_is():
    code = ("clip(\n"
            "    parameters, maximum) / (scaler.get_scale() if not (backend == 'deepspeed') and not (backend == 'fsdp') "
            "else 1.0)\n")
    assert fit_new_lines("", code, 88) == code


def test_the_fixing_run_keeps_emitted_lines_within_the_files_limit():
    """An apex DistributedDataParallel that becomes the native one with find_unused_parameters."""
    source = textwrap.dedent("""\
        import torch
        from apex.parallel import DistributedDataParallel as DDP


        def wrap(generator_network_module):
            generator_network_module = DDP(generator_network_module, delay_allreduce=True)
            return generator_network_module
    """)
    result = migrate_source(source, "train.py", unsafe_fixes=True)
    assert result.error is None
    assert "find_unused_parameters=True" in result.new_source
    assert max(len(line) for line in result.new_source.splitlines()) <= 88


_NAMES = st.sampled_from(["model", "optimizer_state", "scaler", "args.max_grad_norm", "cfg.fp16", "batch['input_ids']",
                          "self.grad_scaler", "x", "learning_rate_schedule"])


def _expressions():
    leaf = _NAMES | st.integers(0, 1000).map(str) | st.just('"a string, with (brackets]"')
    return st.recursive(leaf, lambda inner: st.one_of(
        st.tuples(_NAMES, st.lists(inner, min_size=1, max_size=4)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.tuples(inner, st.sampled_from([" + ", " * ", " and ", " or ", " - "]), inner).map("".join),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.tuples(inner, _NAMES, inner).map(lambda t: f"[{t[0]} for {t[1].split('.')[0].split('[')[0]} in {t[2]}]"),
        st.lists(inner, min_size=1, max_size=3).map(lambda items: "{" + ", ".join(f"'k{i}': v" for i, v in enumerate(items)) + "}"),
        inner.map(lambda e: f"-({e})"),
        inner.map(lambda e: f"(not {e})"),
    ), max_leaves=16)


@settings(max_examples=300, deadline=None)
@given(expression=_expressions(), form=st.sampled_from(["value = {}", "if {}:\n        pass", "return {}", "call({}, key=1)"]),
       depth=st.integers(0, 3))
def test_any_layout_keeps_the_code_and_only_shortens(expression, form, depth):
    indent = "    " * depth
    statement = form.format(expression).replace("\n", "\n" + indent)
    code = "def f():\n" + textwrap.indent(statement, "    " + indent) + "\n"
    if depth:
        code = "def f():\n" + "".join(f"{'    ' * (level + 1)}if c{level}:\n" for level in range(depth)) + \
            textwrap.indent(statement, "    " * (depth + 1)) + "\n"
    fitted = fit_new_lines("", code, 60)
    assert ast.dump(ast.parse(fitted)) == ast.dump(ast.parse(code))
    longest_before = max(len(line) for line in code.splitlines())
    assert max(len(line) for line in fitted.splitlines()) <= max(longest_before, 60)
    if fitted != code:  # a changed layout made the longest line shorter
        assert max(len(line) for line in fitted.splitlines()) < longest_before


def test_a_trailer_holding_one_number_or_name_is_not_split_on_its_own():
    """``.pow(2)`` last on a line past the file's limit of 105: the value goes in parentheses, as
    Black lays it out, not ``pow(`` / ``2`` / ``).mean()``."""
    for trailer in ("scores.pow(2).mean()", "scores.pow(p).mean()"):
        fitted = _fit(f"""\
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.kl_div(F.log_softmax(scores, dim=1), clean_prob, reduction="batchmean") + {trailer}
        """, limit=105)
        assert fitted.splitlines()[1:] == [
            "    loss = (",
            f"        F.kl_div(F.log_softmax(scores, dim=1), clean_prob, reduction=\"batchmean\") + {trailer}",
            "    )",
        ], fitted
