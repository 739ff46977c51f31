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
        ("[tool.ampmigrate]\nselect = 'AMP0'\n", "select in .* must be a list of strings, not 'AMP0'"),
        ("[tool.ampmigrate]\nunsafe-fixes = 'yes'\n", "unsafe-fixes in .* must be a bool"),
        ("[tool.ampmigrate]\nselect = [\n", "is not valid TOML"),
        ("[tool.ampmigrate]\noutput-format = 'xml'\n", r"output-format in .* must be one of text, json, github, sarif, not 'xml'"),
        ("[tool.ampmigrate.settings]\nopt-levl = 'O1'\n", "unknown setting 'opt-levl' .*; known settings: o2-as-autocast, opt-level"),
        ("[tool.ampmigrate.settings]\nopt-level = 'O2'\n", "opt-level must be one of 'O0', 'O1', not 'O2'"),
        ("[tool]\nampmigrate = 3\n", r"tool.ampmigrate in .* must be a table"),
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
