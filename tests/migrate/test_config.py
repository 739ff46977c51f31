"""[tool.ampmigrate] in the nearest pyproject.toml."""
from __future__ import annotations

import pytest

from migrate import config as config_module
from migrate.config import Config, ConfigError, find_pyproject, load_config


def _project(tmp_path, body: str):
    (tmp_path / "pyproject.toml").write_text(body)
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    return tmp_path


def test_nearest_pyproject_above_the_paths_is_found(tmp_path):
    root = _project(tmp_path, "[project]\nname = 'x'\n")
    assert find_pyproject([root / "src" / "pkg"]) == root / "pyproject.toml"
    assert find_pyproject([root / "src" / "pkg", root / "src"]) == root / "pyproject.toml"


def test_settings_are_read(tmp_path):
    root = _project(
        tmp_path,
        '[tool.ampmigrate]\nselect = ["AMP02"]\nignore = ["AMP022"]\nexclude = ["legacy/*"]\n'
        'unsafe-fixes = true\noutput-format = "json"\n',
    )
    config = load_config(root / "pyproject.toml")
    assert config == Config(
        path=root / "pyproject.toml", select=("AMP02",), ignore=("AMP022",), exclude=("legacy/*",),
        unsafe_fixes=True, output_format="json",
    )


def test_no_file_or_no_table_means_defaults(tmp_path):
    assert load_config(None) == Config()
    root = _project(tmp_path, "[tool.black]\nline-length = 100\n")
    assert load_config(root / "pyproject.toml") == Config()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[tool.ampmigrate]\nselekt = ['AMP0']\n", "unknown key 'selekt'"),
        ("[tool.ampmigrate]\nselect = 'AMP0'\n", r'select in .* must be a list of strings, not "AMP0"'),
        ("[tool.ampmigrate]\nunsafe-fixes = 'yes'\n", r'unsafe-fixes in .* must be true or false, not "yes"'),
        ("[tool.ampmigrate]\nselect = [\n", "is not valid TOML"),
        ("[tool.ampmigrate]\noutput-format = 'xml'\n", r'output-format in .* must be one of "text", "json", "github", "sarif", not "xml"'),
        ("[tool.ampmigrate.settings]\nopt-levl = 'O1'\n", "unknown setting 'opt-levl' .*; known settings: o2-as-autocast, opt-level"),
        ("[tool.ampmigrate.settings]\nopt-level = 'O2'\n", r'opt-level must be one of "O0", "O1", not "O2"'),
        ("[tool]\nampmigrate = 3\n", r"tool.ampmigrate in .* must be a table"),
        ("[tool.ampmigrate.settings]\no2-as-autocast = 'yes'\n", r'o2-as-autocast must be one of true, false, not "yes"'),
        ("[tool.ampmigrate.per-file-ignores]\n'tests/*' = 'AMP1'\n", r'"tests/\*" must map to a list of rule codes, not "AMP1"'),
    ],
)
def test_bad_configuration_is_a_clear_error(tmp_path, body, message):
    root = _project(tmp_path, body)
    with pytest.raises(ConfigError, match=message):
        load_config(root / "pyproject.toml")


def test_without_a_toml_reader_a_configured_project_gets_told_what_to_install(tmp_path, monkeypatch):
    root = _project(tmp_path, "[tool.ampmigrate]\nselect = ['AMP0']\n")
    monkeypatch.setattr(config_module, "_toml_module", lambda: None)
    with pytest.raises(ConfigError, match="install 'tomli'"):
        load_config(root / "pyproject.toml")
    # an unconfigured project does not need a TOML reader at all
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert load_config(root / "pyproject.toml") == Config()


def test_a_config_that_is_not_utf8_is_a_clear_error(tmp_path):
    root = _project(tmp_path, "")
    (root / "pyproject.toml").write_bytes(b"# caf\xe9\n[tool.ampmigrate]\nselect = ['AMP0']\n")
    with pytest.raises(ConfigError, match="is not UTF-8"):
        load_config(root / "pyproject.toml")


def test_the_o2_setting_reaches_the_apex_rewrite(tmp_path):
    from migrate.apex_plan import ACCEPT_O2

    root = _project(tmp_path, f"[tool.ampmigrate.settings]\n{ACCEPT_O2} = true\n")
    assert load_config(root / "pyproject.toml").settings == {ACCEPT_O2: True}


# --- the keys as a user writes them, end to end through the command line -------------------------

OLD_SCALER = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
APEX = "from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer)\n"


def _cli(root, *args):
    from click.testing import CliRunner

    from migrate.cli import main

    return CliRunner().invoke(main, ["--check", *map(str, args)], catch_exceptions=False)


def _codes_reported(output: str) -> set[str]:
    import re

    return set(re.findall(r"\b(AMP\d{3})\b", output))


def test_the_new_keys_are_read(tmp_path):
    root = _project(
        tmp_path,
        '[tool.ampmigrate]\nextend-select = ["AMP021"]\nextend-ignore = ["AMP009"]\nextend-exclude = ["gen/*"]\n'
        '[tool.ampmigrate.per-file-ignores]\n"tests/*" = ["AMP8", "AMP001"]\n',
    )
    config = load_config(root / "pyproject.toml")
    assert (config.extend_select, config.extend_ignore, config.extend_exclude) == (("AMP021",), ("AMP009",), ("gen/*",))
    assert config.per_file_ignores == {"tests/*": ("AMP8", "AMP001")}


def test_select_amp0_means_the_apex_rewrites_without_the_opt_in_spellings(tmp_path):
    from migrate.api import select_rules

    chosen = {rule.CODE for rule in select_rules(["AMP0"])}
    assert "AMP001" in chosen and not chosen & {"AMP020", "AMP021", "AMP022", "AMP023", "AMP024", "AMP025"}
    assert {rule.CODE for rule in select_rules(["AMP02"])} == {f"AMP02{n}" for n in range(6)}  # their own group
    assert [rule.CODE for rule in select_rules(["AMP021"])] == ["AMP021"]
    root = _project(tmp_path, '[tool.ampmigrate]\nselect = ["AMP0"]\n')
    (root / "src" / "old.py").write_text(OLD_SCALER)
    assert _cli(root, root / "src").exit_code == 0  # the README's example leaves native code alone


def test_extend_select_adds_to_the_default_and_select_replaces_it(tmp_path):
    root = _project(tmp_path, '[tool.ampmigrate]\nextend-select = ["AMP021"]\n')
    (root / "src" / "old.py").write_text(OLD_SCALER)
    (root / "src" / "apex_train.py").write_text(APEX)
    result = _cli(root, root / "src")
    assert {"AMP021", "AMP002"} <= _codes_reported(result.output), result.output
    result = _cli(root, "--select", "AMP001", root / "src")  # --select replaces extend-select too
    assert "AMP021" not in _codes_reported(result.output)


def test_extend_ignore_adds_to_ignore_and_the_command_line(tmp_path):
    root = _project(tmp_path, '[tool.ampmigrate]\nselect = ["AMP02"]\nignore = ["AMP020"]\nextend-ignore = ["AMP021"]\n')
    (root / "src" / "old.py").write_text(OLD_SCALER)
    assert _cli(root, root / "src").exit_code == 0


def test_per_file_ignores_leave_those_rules_out_of_matching_files_only(tmp_path):
    root = _project(tmp_path, '[tool.ampmigrate]\nselect = ["AMP02"]\n[tool.ampmigrate.per-file-ignores]\n"tests/*" = ["AMP021"]\n')
    (root / "tests").mkdir()
    (root / "tests" / "test_old.py").write_text(OLD_SCALER)
    (root / "src" / "old.py").write_text(OLD_SCALER)
    result = _cli(root, root)
    assert "old.py" in result.output and "test_old.py" not in result.output, result.output
    negated = '[tool.ampmigrate]\nselect = ["AMP02"]\n[tool.ampmigrate.per-file-ignores]\n"!tests/*" = ["AMP021"]\n'
    (root / "pyproject.toml").write_text(negated)
    result = _cli(root, root)
    assert "test_old.py" in result.output and "src/old.py" not in result.output, result.output


def test_extend_exclude_adds_to_exclude(tmp_path):
    root = _project(tmp_path, '[tool.ampmigrate]\nselect = ["AMP02"]\nexclude = ["a/*"]\nextend-exclude = ["generated"]\n')
    for folder in ("a", "generated"):
        (root / folder).mkdir()
        (root / folder / "old.py").write_text(OLD_SCALER)
    assert _cli(root, root).exit_code == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('extend-select = ["AMP9999"]', "extend-select in .*no rule code starts with 'AMP9999'"),
        ('extend-ignore = ["XYZ"]', "extend-ignore in .*no rule code starts with 'XYZ'"),
        ('extend-exclude = "gen"', "extend-exclude in .* must be a list of strings"),
        ('per-file-ignores = ["tests/*"]', "per-file-ignores in .* must be a table"),
        ('per-file-ignores = {"tests/*" = "AMP001"}', r'per-file-ignores .*"tests/\*" must map to a list of rule codes, not "AMP001"'),
        ('per-file-ignores = {"tests/*" = ["AMP07"]}', r"per-file-ignores 'tests/\*' in .*no rule code starts with 'AMP07'"),
    ],
)
def test_a_mistake_in_a_new_key_is_one_error_naming_it_exit_2(tmp_path, body, message):
    import re

    root = _project(tmp_path, f"[tool.ampmigrate]\n{body}\n")
    (root / "src" / "old.py").write_text(OLD_SCALER)
    result = _cli(root, root / "src")
    assert result.exit_code == 2
    assert re.search(message, " ".join(result.output.split())), result.output
    assert (root / "src" / "old.py").read_text() == OLD_SCALER


def test_per_file_ignores_also_spare_the_directives_of_the_rules_they_leave_out(tmp_path):
    root = _project(tmp_path, '[tool.ampmigrate.per-file-ignores]\n"tests/*" = ["AMP800"]\n')
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("import os  # noqa: AMP001\n")
    (root / "src" / "x.py").write_text("import os  # noqa: AMP001\n")
    result = _cli(root, root)
    assert "src/x.py:1:12: AMP800" in result.output and "test_x.py" not in result.output, result.output
