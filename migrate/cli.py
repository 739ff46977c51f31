"""``ampmigrate``: the command line, a thin shell over ``migrate.api``.

Exit status is a bitmask: 0 nothing to do, 1 changes or findings, 2 usage, parse, decode or write
errors (so 3 is both); 130 when stopped by Ctrl-C. Heavy modules are imported only once a file needs parsing, which keeps a
pre-commit run on one file fast.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from typing import Sequence

import click

from migrate.report import FORMATS
from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE

__all__ = ["main"]

_FOUND = 1
_ERROR = 2
_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
_TOOL_CODES = (ERROR_CODE, INTERNAL_ERROR_CODE)  # errors about a file, counted by _ERROR, not findings


def _split_codes(values: Sequence[str]) -> tuple[str, ...]:
    """``--select A,B --select C`` -> ("A", "B", "C")."""
    return tuple(code.strip() for value in values for code in value.split(",") if code.strip())


def _show_explanation(ctx: click.Context, _param: click.Parameter, code: str | None) -> None:
    if code is None or ctx.resilient_parsing:
        return
    from migrate.explain import explain

    try:
        click.echo(explain(code), nl=False)
    except LookupError as error:
        raise click.BadParameter(str(error), ctx=ctx, param_hint="--explain") from error
    ctx.exit(0)


def _show_rules(ctx: click.Context, _param: click.Parameter, wanted: bool) -> None:
    if not wanted or ctx.resilient_parsing:
        return
    from migrate.explain import list_rules

    click.echo(list_rules(), nl=False)
    ctx.exit(0)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--diff", is_flag=True, help="Print a unified diff of the fixes; write nothing.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if anything would change or is reported.")
@click.option("--unsafe-fixes", is_flag=True, default=None, help="Also apply fixes that may change behaviour.")
@click.option("--select", multiple=True, metavar="CODES", help="Run only rules with these code prefixes (comma-separated).")
@click.option("--ignore", multiple=True, metavar="CODES", help="Skip rules with these code prefixes (comma-separated).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave out files and directories matching GLOB.")
@click.option("--output-format", type=click.Choice(FORMATS), default=None, help="How findings are printed.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Worker processes (default: cores).")
@click.option("--stdin-filename", default=None, help="The name of the file read from '-' (for messages).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write a per-file Markdown migration report to this file.")
@click.option("--explain", callback=_show_explanation, expose_value=False, is_eager=True, metavar="CODE",
              help="Explain a rule and exit.")
@click.option("--list-rules", callback=_show_rules, expose_value=False, is_flag=True, is_eager=True,
              help="List the rules and exit.")
@click.version_option(package_name="ampshim", prog_name="ampmigrate")
@click.pass_context
def main(
    ctx: click.Context,
    paths: tuple[str, ...],
    diff: bool,
    check: bool,
    unsafe_fixes: bool | None,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    exclude: tuple[str, ...],
    output_format: str | None,
    jobs: int | None,
    stdin_filename: str | None,
    report_path: str | None,
) -> None:
    """Rewrite NVIDIA apex mixed-precision code in PATHS into native torch.amp, in place.

    PATHS are files or directories (searched recursively); '-' reads one file from standard input
    and writes the result to standard output.
    """
    from migrate import api
    from migrate.config import ConfigError, find_pyproject, load_config

    if not paths:
        raise click.UsageError("no paths given: pass files or directories to migrate, or '-' for standard input")
    if "-" in paths and len(paths) > 1:
        raise click.UsageError("'-' (standard input) cannot be combined with other paths")
    try:
        config = load_config(find_pyproject(paths))
    except (ConfigError, OSError) as error:
        raise click.UsageError(str(error)) from error
    unsafe = config.unsafe_fixes if unsafe_fixes is None else unsafe_fixes
    output_format = output_format or config.output_format or "text"
    for key, codes in config.code_lists():
        try:
            api.select_rules(ignore=codes)
        except ValueError as error:
            raise click.UsageError(f"[tool.ampmigrate] {key} in {str(config.path)!r}: {error}") from error
    # --select replaces select and extend-select; ignores add up
    selected = _split_codes(select) or config.select
    extended = () if select else config.extend_select
    ignored = config.ignore + config.extend_ignore + _split_codes(ignore)
    try:
        # the whole catalogue is left to the API, which imports it only once a file needs it
        rules = api.select_rules(selected, ignored, extend_select=extended) if selected or extended or ignored else None
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    write = not (check or diff)
    run = dict(
        rules=rules, unsafe_fixes=unsafe, fix=not check or diff, settings=config.settings,
        per_file_ignores=config.per_file_ignores,
    )

    if report_path is not None:
        _check_report_path(report_path, paths)
    interrupted = None
    if paths == ("-",):
        data = sys.stdin.buffer.read()
        results = [api.migrate_source(data, stdin_filename or "-", **run)]
        if write:
            result = results[0]
            fixed = result.new_source.encode(result.encoding) if result.changed else data
            sys.stdout.buffer.write(fixed)
            sys.stdout.flush()
    else:
        try:
            results = api.migrate_paths(
                paths, write=write, exclude=config.exclude + config.extend_exclude + exclude,
                respect_gitignore=config.respect_gitignore, jobs=jobs, **run,
            )
        except FileNotFoundError as error:
            raise click.UsageError(str(error.strerror or error)) from error
        except api.Interrupted as stop:
            results, interrupted = stop.results, stop
        except KeyboardInterrupt:  # the second Ctrl-C
            click.echo("Stopped at once: every file is whole, as it was or as rewritten; run again to finish.", err=True)
            ctx.exit(_INTERRUPTED)

    _print(results, rules, output_format, diff=diff, wrote=write, unsafe=unsafe, to_stdout=paths != ("-",) or not write)
    if report_path is not None:
        from migrate.report import migration_report

        _write_report(report_path, migration_report(results, wrote=write, unsafe_fixes=unsafe))
    if interrupted is not None:
        written = sum(1 for result in results if result.changed) if write else 0
        click.echo(
            f"Interrupted: {len(results)} of {interrupted.total} files done"
            + (f", {written} of them rewritten" if write else "")
            + "; run again to finish.",
            err=True,
        )
        ctx.exit(_INTERRUPTED)
    ctx.exit(_exit_code(results))


def _check_report_path(report_path: str, paths: Sequence[str]) -> None:
    """Refuse, before anything is rewritten, a report that would overwrite code or could not be written."""
    import os

    target = os.path.realpath(report_path)
    inputs = {os.path.realpath(path) for path in paths if path != "-"}
    if target in inputs or (target.endswith(".py") and os.path.exists(target)):
        raise click.BadParameter(
            f"{report_path!r} is {'one of the paths to migrate' if target in inputs else 'an existing Python file'}; "
            "the report would overwrite it: name a new file, such as migration-report.md",
            param_hint="'--report'",
        )
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise click.BadParameter(f"the folder of {report_path!r} does not exist: create it first", param_hint="'--report'")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"the folder of {report_path!r} is not writable", param_hint="'--report'")


def _write_report(report_path: str, text: str) -> None:
    """Atomically, so that an interrupted or failed write leaves no half report."""
    import os
    import tempfile

    folder = os.path.dirname(os.path.realpath(report_path))
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".ampmigrate-report.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, report_path)
    except BaseException:
        os.unlink(temporary)
        raise


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def _print(results, rules, output_format: str, *, diff: bool, wrote: bool, unsafe: bool, to_stdout: bool) -> None:
    """Findings to stdout (stderr when stdout carries the fixed source), diffs to stdout, summary to stderr."""
    from migrate.report import format_results, summary

    if diff:
        for result in results:
            if result.changed:
                click.echo(_unified_diff(result), nl=False)
        click.echo(summary(results, wrote=False, unsafe_fixes=unsafe), nl=False, err=True)
        return
    if wrote and output_format == "text":
        # what was fixed is gone: show what is left, where it now is
        shown = [replace(result, diagnostics=result.remaining) for result in results]
    else:
        shown = results
    if output_format == "sarif" and rules is None:
        from migrate.rules import all_rules

        rules = all_rules()
    click.echo(format_results(shown, output_format, rules or ()), nl=False, err=not to_stdout)
    if output_format == "text":
        click.echo(summary(results, wrote=wrote, unsafe_fixes=unsafe), nl=False, err=True)


def _unified_diff(result) -> str:
    import difflib

    before = result.source.splitlines(keepends=True)
    after = result.new_source.splitlines(keepends=True)
    name = result.filename.lstrip("/")
    lines = difflib.unified_diff(before, after, f"a/{name}", f"b/{name}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _exit_code(results) -> int:
    code = 0
    for result in results:
        if result.error:
            code |= _ERROR
        if result.changed or any(d.code not in _TOOL_CODES for d in result.diagnostics):
            code |= _FOUND
    return code


if __name__ == "__main__":
    sys.exit(main())
