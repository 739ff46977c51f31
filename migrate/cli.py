"""``ampmigrate``: the command line, a thin shell over ``migrate.api``.

Exit status is a bitmask: 0 nothing to do, 1 changes or findings, 2 usage, configuration, file or
internal errors (so 3 is both); 130 when stopped by Ctrl-C. Heavy modules are imported only once a
file needs parsing, which keeps a pre-commit run on one file fast.
"""
from __future__ import annotations

import os
import sys
from typing import NamedTuple, Sequence

import click

from migrate.report import FORMATS
from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE

__all__ = ["main", "run"]

_FOUND = 1
_ERROR = 2
_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
_TOOL_CODES = (ERROR_CODE, INTERNAL_ERROR_CODE)  # errors about a file, counted by _ERROR, not findings
_PROGRESS_MIN_FILES = 50  # fewer files are done before a bar would be read


class _Command(click.Command):
    """Exits with status 2 and a one-line message on an unexpected error, instead of a traceback
    and status 1, which would read as "findings"."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:  # the reader left (`ampmigrate | head`): nothing more to say, to anyone
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(_FOUND)
        except Exception as error:
            click.echo(f"ampmigrate: internal error: {type(error).__name__}: {error}; please report it", err=True)
            ctx.exit(_ERROR)


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


@click.command(cls=_Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--diff", is_flag=True, help="Print a unified diff of the fixes; write nothing.")
@click.option("--add-noqa", is_flag=True,
              help="Add a `# noqa` directive for every current finding (fixing nothing), so that only new code is held to the rules.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if anything would change or is reported.")
@click.option("--unsafe-fixes", is_flag=True, default=None, help="Also apply fixes that may change behaviour.")
@click.option("--select", multiple=True, metavar="CODES", help="Run only rules with these code prefixes (comma-separated).")
@click.option("--ignore", multiple=True, metavar="CODES", help="Skip rules with these code prefixes (comma-separated).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave out files and directories matching GLOB.")
@click.option("--output-format", type=click.Choice(FORMATS), default=None, help="How findings are printed.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Worker processes (default: cores).")
@click.option("--stdin-filename", default=None, help="The name of the file read from '-' (for messages).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write a Markdown migration plan to this file: a summary table, then what remains per file.")
@click.option("--show-fixes", is_flag=True, help="List the fixes applied (or that would be), per file.")
@click.option("--statistics", is_flag=True, help="Print the number of findings per code instead of the findings.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings or changes (errors still exit 2).")
@click.option("-q", "--quiet", is_flag=True, help="Print the findings only: no summary, no progress bar.")
@click.option("--output-file", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the findings to this file instead of standard output.")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="Colour codes and diffs: auto colours them in a terminal only.")
@click.option("--explicit-paths", is_flag=True,
              help="With no PATHS, check nothing (for hooks that pass the files to check); "
                   "without it, no PATHS means the current directory.")
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
    add_noqa: bool,
    check: bool,
    unsafe_fixes: bool | None,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    exclude: tuple[str, ...],
    output_format: str | None,
    jobs: int | None,
    stdin_filename: str | None,
    report_path: str | None,
    show_fixes: bool,
    statistics: bool,
    exit_zero: bool,
    quiet: bool,
    output_file: str | None,
    color: str,
    explicit_paths: bool,
) -> None:
    """Rewrite NVIDIA apex mixed-precision code in PATHS into native torch.amp, in place, and report
    what needs a person.

    PATHS are files or directories (searched recursively; none: the current directory); '-' reads
    one file from standard input and writes the result to standard output.
    """
    from migrate import api
    from migrate.config import ConfigError, find_pyproject, load_config

    if not paths:
        if explicit_paths:  # a hook that matched no file: nothing to check, and never the whole tree
            ctx.exit(0)
        paths = (".",)
    if "-" in paths and len(paths) > 1:
        raise click.UsageError("'-' (standard input) cannot be combined with other paths")
    if add_noqa and (diff or "-" in paths):
        raise click.UsageError("--add-noqa writes directives into files: not with --diff or '-'")
    check = check or add_noqa  # the findings as they are: nothing is fixed
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
    edits = output_format in ("json", "sarif") and not statistics
    run = dict(
        # --check works the fixes out too: what it calls remaining is what the fixing run leaves
        rules=rules, unsafe_fixes=unsafe, settings=config.settings,
        per_file_ignores=config.per_file_ignores, edits=edits,
    )

    for path, option in ((report_path, "--report"), (output_file, "--output-file")):
        if path is not None:
            _check_output_path(path, paths, option)
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
            with _Progress(enabled=not quiet and _progress_wanted()) as progress:
                results = api.migrate_paths(
                    paths, write=write, exclude=config.exclude + config.extend_exclude + exclude,
                    respect_gitignore=config.respect_gitignore, jobs=jobs, progress=progress, **run,
                )
        except FileNotFoundError as error:
            raise click.UsageError(str(error.strerror or error)) from error
        except api.Interrupted as stop:
            results, interrupted = stop.results, stop
            _second_interrupt_exits(ctx)
        except KeyboardInterrupt:  # the second Ctrl-C
            click.echo("Stopped at once: every file is whole, as it was or as rewritten; run again to finish.", err=True)
            ctx.exit(_INTERRUPTED)
        else:
            _second_interrupt_exits(ctx)  # a Ctrl-C that comes once the files are done, as the summary prints

    if add_noqa:
        _add_directives(results, quiet)
        ctx.exit(_exit_code(results) & ~_FOUND)
    view = _View(
        output_format, color={"auto": None, "always": True, "never": False}[color], quiet=quiet,
        statistics=statistics, show_fixes=show_fixes, output_file=output_file,
        to_stdout=paths != ("-",) or not write,
    )
    _print(results, rules, view, diff=diff, wrote=write, unsafe=unsafe)
    if report_path is not None:
        from migrate.migration_report import migration_report

        _write_atomically(report_path, migration_report(results, wrote=write, unsafe_fixes=unsafe))
    if interrupted is not None:
        written = sum(1 for result in results if result.changed) if write else 0
        click.echo(
            f"Interrupted: {len(results)} of {interrupted.total} files done"
            + (f", {written} of them rewritten" if write else "")
            + "; run again to finish.",
            err=True,
        )
        _ignore_late_interrupts(ctx)
        ctx.exit(_INTERRUPTED)
    code = _exit_code(results)
    _ignore_late_interrupts(ctx)
    ctx.exit(code & ~_FOUND if exit_zero else code)


# What ``run`` hands ``main`` as its context's object: the process is the command's own, and its
# signal handlers are the command's to set. Called in-process (``main([...])``, click's test
# runner), the command leaves the caller's handlers as they were.
_OWN_PROCESS = "ampmigrate owns the process"


def _ignore_late_interrupts(ctx: click.Context) -> None:
    """Everything is written and printed: a Ctrl-C from here on is ignored, as the command is
    returning anyway. Python puts back the default handler of a signal it handles as it exits,
    and a Ctrl-C then killed the process by SIGINT instead of exiting with its code."""
    import signal
    import threading

    if ctx.obj == _OWN_PROCESS and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _second_interrupt_exits(ctx: click.Context) -> None:
    """Once the run is over (stopped by a first Ctrl-C, or done), a Ctrl-C while the summary is
    printed ends the command at once with 130 (not Python's KeyboardInterrupt, which kills it by
    SIGINT)."""
    import signal
    import threading

    if ctx.obj != _OWN_PROCESS or threading.current_thread() is not threading.main_thread():
        return

    def stop(_signal, _frame) -> None:
        raise SystemExit(_INTERRUPTED)

    # Left in place to the end: the signal may come as the command returns, or as Python exits.
    signal.signal(signal.SIGINT, stop)


def _add_directives(results, quiet: bool) -> None:
    from migrate.add_noqa import add_noqa

    added = add_noqa(results)
    for problem in added.skipped:
        click.echo(f"ampmigrate: {problem}", err=True)
    if not quiet:
        click.echo(f"Added {added.codes} noqa directive{'s' if added.codes != 1 else ''} to "
                   f"{added.files} file{'s' if added.files != 1 else ''}.", err=True)


def _progress_wanted(stream=None, environ=None) -> bool:
    """A progress bar is for a person at a terminal: not when stderr is piped or in CI."""
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    return stream.isatty() and not environ.get("CI") and environ.get("TERM") != "dumb"


class _Progress:
    """``progress(done, total)`` for ``migrate_paths``: a bar on stderr once the tree is large."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None

    def __enter__(self) -> "_Progress":
        return self

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None and self.enabled and total >= _PROGRESS_MIN_FILES:
            self.bar = click.progressbar(length=total, label="Checking", file=sys.stderr, show_pos=True)
            self.bar.__enter__()
        if self.bar is not None:
            self.bar.update(done - self.bar.pos)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


def _check_output_path(target_path: str, paths: Sequence[str], option: str) -> None:
    """Refuse, before anything is rewritten, an output file that would overwrite code or could not be written."""
    target = os.path.realpath(target_path)
    inputs = {os.path.realpath(path) for path in paths if path != "-"}
    if target in inputs or (target.endswith(".py") and os.path.exists(target)):
        raise click.BadParameter(
            f"{target_path!r} is {'one of the paths to migrate' if target in inputs else 'an existing Python file'}; "
            f"the output would overwrite it: name a new file, such as {'migration-report.md' if option == '--report' else 'findings.txt'}",
            param_hint=f"'{option}'",
        )
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise click.BadParameter(f"the folder of {target_path!r} does not exist: create it first", param_hint=f"'{option}'")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"the folder of {target_path!r} is not writable", param_hint=f"'{option}'")


def _write_atomically(target_path: str, text: str) -> None:
    """So that an interrupted or failed write leaves no half report."""
    import tempfile

    folder = os.path.dirname(os.path.realpath(target_path))
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".ampmigrate-report.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, target_path)
    except BaseException:
        os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class _View(NamedTuple):
    """How the findings are shown: the format, colour (None: in a terminal only), and where."""

    output_format: str
    color: bool | None
    quiet: bool
    statistics: bool
    show_fixes: bool
    output_file: str | None
    to_stdout: bool  # False: stdout carries the fixed source (stdin mode), findings go to stderr


def _print(results, rules, view: _View, *, diff: bool, wrote: bool, unsafe: bool) -> None:
    """Findings to stdout (stderr when stdout carries the fixed source), diffs to stdout, summary to stderr."""
    from migrate import report

    if diff:
        for result in results:
            if result.changed:
                click.echo(_unified_diff(result, styled=view.color is not False), nl=False, color=view.color)
        if view.show_fixes:  # beside the patch, which stdout carries alone
            click.echo(report.show_fixes(results, wrote=False), nl=False, err=True)
    else:
        # what was fixed is gone: show what is left, where it now is
        shown = [result._replace(diagnostics=result.remaining) for result in results] if wrote else results
        if (view.output_format == "sarif" or view.statistics) and rules is None:
            from migrate.rules import all_rules

            rules = all_rules()
        styled = view.color is not False and view.output_file is None
        if view.statistics:
            text = report.statistics(shown, rules, view.output_format)
        else:
            text = report.format_results(shown, view.output_format, rules or (), color=styled)
        if view.show_fixes and view.output_format == "text":
            text += report.show_fixes(results, wrote=wrote)
        if view.output_file is not None:
            _write_atomically(view.output_file, text)
        else:
            click.echo(text, nl=False, err=not view.to_stdout, color=view.color)
    if view.output_format == "text" and not view.quiet:
        sys.stdout.flush()  # every finding out before the summary: in a log of both streams it is the last line
        click.echo(report.summary(results, wrote=wrote and not diff, unsafe_fixes=unsafe),
                   nl=False, err=True)


def _unified_diff(result, styled: bool) -> str:
    """A Python file's diff, or a notebook's: one per changed cell, labelled ``nb.ipynb:cell 3``
    on both sides as Ruff labels them (the JSON around the sources does not change)."""
    from migrate import notebook

    if result.filename.endswith(notebook.SUFFIX):
        text = "".join(
            # a cell's last line has no line end in the JSON: that is no change to mark
            _diff(_ended(old), _ended(new), f"{result.filename}:cell {number}", f"{result.filename}:cell {number}")
            for number, old, new in notebook.changed_cells(result.source, result.new_source)
        )
    else:
        name = result.filename.lstrip("/")
        text = _diff(result.source, result.new_source, f"a/{name}", f"b/{name}")
    return "".join(_diff_style(line) for line in text.splitlines(keepends=True)) if styled else text


def _ended(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _diff(before: str, after: str, old_label: str, new_label: str) -> str:
    import difflib

    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), old_label, new_label)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _diff_style(line: str) -> str:
    for prefix, colour in (("+++", None), ("---", None), ("+", "green"), ("-", "red"), ("@@", "cyan")):
        if line.startswith(prefix):
            return click.style(line, fg=colour, bold=True if colour is None else None)
    return line


def _exit_code(results) -> int:
    code = 0
    for result in results:
        if result.error:
            code |= _ERROR
        if result.changed or any(d.code not in _TOOL_CODES for d in result.diagnostics):
            code |= _FOUND
    return code


if __name__ == "__main__":
    main(prog_name="ampmigrate")


def run() -> None:
    """The ``ampmigrate`` command (``main``), leaving the process at once when it is done.

    An interpreter's normal exit frees every object one by one: libcst's thousands of classes,
    the parsed trees. That is about a sixth of a one-file run (a pre-commit hook's), for nothing:
    what the command writes is complete by then (its files are closed, the workers gone), and
    only the standard streams remain to be flushed.
    """
    status: object = 0
    try:
        main(prog_name="ampmigrate", obj=_OWN_PROCESS)  # standalone: ends in SystemExit
    except SystemExit as exit_:
        status = exit_.code
    if status is not None and not isinstance(status, int):
        print(status, file=sys.stderr)  # as Python reports `sys.exit("message")`
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader left, or the stream was closed
            pass
    os._exit(status or 0)
