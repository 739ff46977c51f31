"""The API over files and trees: discovery, the text pre-check, encodings, atomic writes, per-file errors."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from migrate import api
from migrate import file_run, prefilter, run_in_workers
from migrate.api import discover, migrate_paths, migrate_source, select_rules
from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE

OLD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
NEW = 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'


@pytest.fixture(autouse=True)
def _every_rule_by_default(monkeypatch):
    """These tests exercise the machinery with the simplest rules, the opt-in AMP02x spellings."""
    from migrate.rules import all_rules

    for rule in all_rules():
        monkeypatch.setattr(rule, "DEFAULT", True)
    monkeypatch.setattr(prefilter, "PLAIN_RUN_WORDS", tuple(sorted({w for rule in all_rules() for w in rule.TRIGGERS})))



def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_migrate_source_returns_the_fixed_text_and_diagnostics():
    result = migrate_source(OLD, "train.py")
    assert result.new_source == NEW and result.changed and result.error is None
    assert [(d.code, d.filename, d.applied) for d in result.diagnostics] == [("AMP021", "train.py", True)]


def test_migrate_source_with_nothing_to_do_is_unchanged():
    result = migrate_source("import torch\nprint(torch.ones(1))\n")
    assert not result.changed and result.diagnostics == ()


def test_select_and_ignore_by_code_prefix():
    assert [r.CODE for r in select_rules(["AMP020", "AMP021", "AMP022"], ["AMP022"])] == ["AMP020", "AMP021"]
    assert {r.CODE for r in select_rules(["AMP02"])} >= {"AMP020", "AMP021", "AMP022", "AMP023", "AMP024"}
    assert migrate_source(OLD, ignore=["AMP021"]).new_source == OLD
    assert migrate_source(OLD, select=["amp021"]).new_source == NEW
    with pytest.raises(ValueError, match="no rule code starts with 'XYZ'"):
        select_rules(["XYZ"])


def test_discovery_skips_vcs_build_virtualenvs_and_user_excludes(tmp_path):
    for relative in [
        "pkg/train.py", "pkg/sub/model.py", ".git/hooks/x.py", "build/lib/x.py", "dist/x.py",
        "pkg/__pycache__/x.py", "node_modules/x.py", "env/lib/x.py", "pkg/legacy/old.py", "pkg/gen_pb2.py",
        ".tox/py/x.py", "pkg/notes.txt",
    ]:
        _write(tmp_path / relative, "x = 1\n")
    _write(tmp_path / "env/pyvenv.cfg", "home = /usr\n")
    found = discover([tmp_path], exclude=["legacy", "*_pb2.py"])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["pkg/sub/model.py", "pkg/train.py"]
    # an explicit file is taken whatever its suffix, unless excluded
    assert discover([tmp_path / "pkg/notes.txt"]) == [tmp_path / "pkg/notes.txt"]
    assert discover([tmp_path / "pkg/gen_pb2.py"], exclude=["*_pb2.py"]) == []


def test_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        discover([tmp_path / "nope"])


@pytest.fixture
def parsed(monkeypatch):
    """The names of the files a run in this process parses, in order."""
    names = []
    real = file_run.migrate_one

    def spy(filename, *args, **kwargs):
        names.append(Path(filename).name)
        return real(filename, *args, **kwargs)

    monkeypatch.setattr(file_run, "migrate_one", spy)
    return names


def test_files_without_trigger_words_are_not_parsed(tmp_path, parsed):
    plain = _write(tmp_path / "plain.py", "import torch\n")
    relevant = _write(tmp_path / "train.py", OLD)
    results = migrate_paths([tmp_path], write=False, jobs=1, select=["AMP02"])
    assert [Path(r.filename).name for r in results] == ["plain.py", "train.py"]
    assert parsed == ["train.py"]
    assert results[0].diagnostics == () and not results[0].changed
    assert plain.read_text() == "import torch\n" and relevant.read_text() == OLD  # write=False


def test_a_file_only_step_rules_could_read_is_not_parsed_without_a_step(tmp_path, parsed):
    inference = _write(tmp_path / "infer.py", "import torch\nwith torch.cuda.amp.autocast():\n    for x in loader:\n        print(model(x).argmax(1).item())\n")
    _write(tmp_path / "train.py", "with torch.autocast('cuda'):\n    loss = model(x)\n    loss.backward()\n")
    results = migrate_paths([tmp_path], write=False, jobs=1)
    assert parsed == ["train.py"]
    assert [d.code for r in results for d in r.diagnostics] == ["AMP104"]
    parsed.clear()
    results = migrate_paths([inference], write=False, jobs=1, select=["AMP020"])  # reads autocast anywhere
    assert parsed == ["infer.py"] and [d.code for d in results[0].diagnostics] == ["AMP020"]


def test_trigger_words_match_whole_words_only(tmp_path):
    lookalike = _write(tmp_path / "a.py", "x = MyGradScalerFactory()\nautocasting = 1\n")
    [result] = migrate_paths([lookalike], write=False, select=["AMP02"])
    assert result.source is None  # skipped unparsed
    [parsed] = migrate_paths([_write(tmp_path / "b.py", "from torch.cuda.amp import GradScaler as S\n")], write=False, select=["AMP02"])
    assert parsed.source is not None


def test_rewrites_in_place_and_leaves_files_with_nothing_to_do_byte_identical(tmp_path):
    changed = _write(tmp_path / "a.py", OLD)
    untouched_bytes = b"# GradScaler is mentioned, nothing else\r\nx = 1   \r\n\r\n"
    untouched = _write(tmp_path / "b.py", untouched_bytes)
    before = untouched.stat().st_mtime_ns
    results = migrate_paths([tmp_path], jobs=1)
    assert changed.read_text() == NEW
    assert untouched.read_bytes() == untouched_bytes and untouched.stat().st_mtime_ns == before
    assert [r.changed for r in results] == [True, False]
    assert migrate_paths([tmp_path], jobs=1)[0].changed is False  # second run: nothing to do
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary file was left behind"


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("crlf.py", OLD.replace("\n", "\r\n").encode(), NEW.replace("\n", "\r\n").encode()),
        ("bom.py", b"\xef\xbb\xbf" + OLD.encode(), b"\xef\xbb\xbf" + NEW.encode()),
        (
            "latin1.py",
            ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + OLD).encode("latin-1"),
            ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + NEW).encode("latin-1"),
        ),
        ("utf8.py", ("# h\u00e9llo \u2192\n" + OLD).encode(), ("# h\u00e9llo \u2192\n" + NEW).encode()),
    ],
)
def test_encoding_bom_and_line_endings_are_kept(tmp_path, name, data, expected):
    path = _write(tmp_path / name, data)
    [result] = migrate_paths([path])
    assert result.error is None and result.changed
    assert path.read_bytes() == expected


def test_file_mode_is_kept(tmp_path):
    path = _write(tmp_path / "run.py", "#!/usr/bin/env python\n" + OLD)
    path.chmod(0o751)
    migrate_paths([path])
    assert stat.S_IMODE(path.stat().st_mode) == 0o751
    assert path.read_text().endswith(NEW)


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="only root can give a file away")
def test_owner_is_kept_when_run_as_another_user(tmp_path):
    path = _write(tmp_path / "theirs.py", OLD)
    os.chown(path, 1234, 5678)
    migrate_paths([path])
    assert (path.stat().st_uid, path.stat().st_gid) == (1234, 5678) and path.read_text() == NEW


def test_symlinked_file_is_written_through(tmp_path):
    target = _write(tmp_path / "real.py", OLD)
    link = tmp_path / "link.py"
    link.symlink_to(target)
    migrate_paths([link])
    assert link.is_symlink() and target.read_text() == NEW


def test_bad_files_are_reported_and_left_untouched_while_the_rest_is_processed(tmp_path):
    syntax = _write(tmp_path / "a_syntax.py", "import torch\nx = torch.cuda.amp.GradScaler(\n")
    not_utf8 = _write(tmp_path / "b_latin.py", b"# caf\xe9\n" + OLD.encode())
    bad_cookie = _write(tmp_path / "c_cookie.py", b"# -*- coding: nonsense -*-\n" + OLD.encode())
    good = _write(tmp_path / "d_good.py", OLD)
    results = migrate_paths([tmp_path], jobs=1)
    by_name = {Path(r.filename).name: r for r in results}
    for path in (syntax, not_utf8, bad_cookie):
        result = by_name[path.name]
        assert result.error and result.diagnostics[0].code == ERROR_CODE, path.name
        assert not result.changed
    assert "cannot parse" in by_name["a_syntax.py"].error
    assert "cannot decode as 'utf-8'" in by_name["b_latin.py"].error and "PEP 263" in by_name["b_latin.py"].error
    assert syntax.read_text() == "import torch\nx = torch.cuda.amp.GradScaler(\n"
    assert not_utf8.read_bytes() == b"# caf\xe9\n" + OLD.encode()
    assert good.read_text() == NEW


def test_read_only_file_is_reported_and_left_untouched(tmp_path):
    path = _write(tmp_path / "ro.py", OLD)
    path.chmod(0o444)
    [result] = migrate_paths([path])
    assert result.error and "read-only" in result.error and not result.changed
    assert not any(d.applied for d in result.diagnostics)
    assert path.read_text() == OLD


def test_failed_write_leaves_the_original_and_no_temporary_file(tmp_path, monkeypatch):
    path = _write(tmp_path / "a.py", OLD)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    [result] = migrate_paths([path])
    assert "cannot write: Permission denied" in result.error
    assert path.read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]


def test_parallel_run_gives_the_same_results_as_a_serial_one(tmp_path):
    for index in range(12):
        _write(tmp_path / f"m{index:02}.py", OLD if index % 3 else "import torch\nprint(torch.ones(2))\n")
    serial = migrate_paths([tmp_path], write=False, jobs=1)
    parallel = migrate_paths([tmp_path], write=False, jobs=2)
    assert parallel == serial
    assert sum(r.changed for r in parallel) == 8
    written = migrate_paths([tmp_path], jobs=2)
    assert sum(r.changed for r in written) == 8
    assert all(p.read_text() != OLD for p in tmp_path.iterdir())


def test_check_mode_computes_no_new_text_but_marks_fixable_findings(tmp_path):
    path = _write(tmp_path / "a.py", OLD)
    [result] = migrate_paths([path], fix=False, write=False)
    assert not result.changed and result.diagnostics[0].applied
    assert path.read_text() == OLD


def test_an_unexpected_failure_on_one_file_does_not_stop_the_others(tmp_path, monkeypatch):
    import migrate.engine

    bad = _write(tmp_path / "a.py", OLD)
    good = _write(tmp_path / "b.py", OLD)
    real = migrate.engine.run_rules

    def flaky(text, filename, *args, **kwargs):
        if filename.endswith("a.py"):
            raise RecursionError("maximum recursion depth exceeded")
        return real(text, filename, *args, **kwargs)

    monkeypatch.setattr(migrate.engine, "run_rules", flaky)
    first, second = migrate_paths([tmp_path], jobs=1)
    assert first.diagnostics[0].code == INTERNAL_ERROR_CODE and "RecursionError" in first.error
    assert bad.read_text() == OLD and good.read_text() == NEW and second.changed


def test_a_file_edited_while_the_run_is_in_progress_is_not_overwritten(tmp_path, monkeypatch):
    from migrate import engine

    edited = OLD.replace("import torch", "import TORCH")  # same size: caught by the content, not the length
    path = _write(tmp_path / "train.py", OLD)
    real_run = engine.run_rules

    def run_then_edit(source, filename, *args, **kwargs):
        outcome = real_run(source, filename, *args, **kwargs)
        Path(filename).write_text(edited)  # the user saves the file while ampmigrate works on it
        return outcome

    monkeypatch.setattr(engine, "run_rules", run_then_edit)
    [result] = migrate_paths([path])
    assert path.read_text() == edited
    assert not result.changed and "changed on disk while ampmigrate ran" in result.error
    assert [d.code for d in result.diagnostics][0] == ERROR_CODE and not any(d.applied for d in result.diagnostics)


def test_hard_links_are_kept(tmp_path):
    path = _write(tmp_path / "train.py", OLD)
    other = tmp_path / "linked.py"
    os.link(path, other)
    path.chmod(0o640)
    migrate_paths([path])
    assert path.read_text() == NEW and other.read_text() == NEW
    path.write_text(OLD)
    [result] = migrate_paths([tmp_path])  # both names in the tree: one file, rewritten once
    assert result.filename == str(other) and result.changed and not result.error
    assert path.read_text() == NEW
    path.write_text(OLD)
    [result] = migrate_paths([path, other])  # both named
    assert result.filename == str(path) and result.changed and not result.error
    assert path.stat().st_ino == other.stat().st_ino and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_file_with_cr_line_ends_keeps_its_last_newline(tmp_path):
    path = _write(tmp_path / "train.py", OLD.replace("\n", "\r"))
    migrate_paths([path])
    assert path.read_bytes() == NEW.replace("\n", "\r").encode()
    assert migrate_source(OLD.replace("\n", "\r")).new_source == NEW.replace("\n", "\r")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32"])
def test_utf16_files_are_reported_never_passed_as_clean(tmp_path, encoding):
    with_findings = _write(tmp_path / "a.py", OLD.encode(encoding))
    without = _write(tmp_path / "b.py", "x = 1\n".encode(encoding))
    results = migrate_paths([tmp_path])
    assert [r.filename for r in results if r.error] == [str(with_findings), str(without)]
    assert all("UTF-16 or UTF-32" in r.error for r in results)
    assert with_findings.read_bytes() == OLD.encode(encoding)


def test_undecodable_file_without_trigger_words_is_reported(tmp_path):
    path = _write(tmp_path / "latin.py", b"# caf\xe9\nx = 1\n")
    [result] = migrate_paths([tmp_path])
    assert result.error and "cannot decode" in result.error and path.read_bytes() == b"# caf\xe9\nx = 1\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifos_named_py_are_skipped_in_a_tree_and_reported_when_named(tmp_path):
    good = _write(tmp_path / "train.py", OLD)
    os.mkfifo(tmp_path / "pipe.py")  # reading it would wait for a writer forever
    assert migrate_paths([tmp_path]) and good.read_text() == NEW
    assert discover([tmp_path]) == [good]
    [result] = migrate_paths([tmp_path / "pipe.py"])
    assert "not a regular file" in result.error


def test_symlinks_are_not_followed_out_of_the_tree(tmp_path):
    outside = _write(tmp_path / "elsewhere" / "shared.py", OLD)
    tree = tmp_path / "project"
    inside = _write(tree / "train.py", OLD)
    (tree / "shared.py").symlink_to(outside)
    (tree / "again.py").symlink_to(inside)  # the same file twice: read once
    results = migrate_paths([tree])
    assert [r.filename for r in results] == [str(inside)]
    assert outside.read_text() == OLD and inside.read_text() == NEW and (tree / "shared.py").is_symlink()


def test_symlink_loops_are_reported_not_raised(tmp_path):
    _write(tmp_path / "train.py", OLD)
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    results = migrate_paths([tmp_path], exclude=["*.txt"])
    errors = {Path(r.filename).name: r.error for r in results if r.error}
    assert errors == dict.fromkeys(["a.py", "b.py", "loop.py"], "a symbolic link loop: skipped")
    assert (tmp_path / "train.py").read_text() == NEW
    [named] = migrate_paths([tmp_path / "loop.py"])
    assert named.error == "a symbolic link loop: skipped"


def test_jobs_are_capped_at_the_cores(tmp_path, monkeypatch):
    import concurrent.futures

    for index in range(api._PARALLEL_MIN_FILES):
        _write(tmp_path / f"m{index}.py", OLD)
    started = []

    class Recording(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, max_workers=None, **kwargs):
            started.append(max_workers)
            super().__init__(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Recording)
    monkeypatch.setattr(run_in_workers, "cores", lambda: 2)
    results = migrate_paths([tmp_path], jobs=64, write=False)
    assert started == [2, 2] and all(r.changed for r in results)  # the workers that triage, then those that migrate
