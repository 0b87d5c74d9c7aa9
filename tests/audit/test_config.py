"""`[tool.kvref]`: project root discovery, key validation, and rule selection semantics."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvref.audit.discover.config import (
    CONFIG_KEYS,
    ConfigError,
    SelectionLayer,
    find_project_root,
    load_config,
    parse_config_table,
    resolve_selection,
)
from kvref.audit.discover.files import DEFAULT_EXCLUDES
from kvref.audit.model import DEFAULT_EXEMPT_NAMES
from tests.audit.fakes import FAKE_RULES

CODES = [rule.code for rule in FAKE_RULES]


def test_root_is_the_nearest_pyproject_above_the_paths(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "sub" / "inner").mkdir(parents=True)
    (tmp_path / "sub" / "pyproject.toml").write_text("")
    (tmp_path / "sub" / "inner" / "m.py").write_text("")
    assert find_project_root([Path("sub/inner/m.py")], tmp_path) == (
        tmp_path / "sub",
        tmp_path / "sub" / "pyproject.toml",
    )
    assert find_project_root([], tmp_path / "sub" / "inner")[0] == tmp_path / "sub"
    assert find_project_root([], tmp_path) == (tmp_path, tmp_path / "pyproject.toml")


def test_without_pyproject_the_root_is_the_common_parent(tmp_path: Path) -> None:
    (tmp_path / "a" / "x").mkdir(parents=True)
    (tmp_path / "a" / "y").mkdir()
    (tmp_path / "a" / "x" / "m.py").write_text("")
    root, source = find_project_root([tmp_path / "a/x/m.py", tmp_path / "a/y"], tmp_path)
    if source is None:  # no pyproject.toml anywhere above tmp_path
        assert root == tmp_path / "a"


def test_every_key_is_read(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        """
[tool.kvref]
select = ["kvr0"]
extend-select = ["KVR103"]
ignore = ["KVR002"]
extend-exclude = ["tests/fixtures"]
per-file-ignores = {"tests/**" = ["KVR001"]}
respect-gitignore = false
force-exclude = true
override-import = "typing"
baseline = ".kvref-baseline.json"
object-dunders = false
abstract-implementations = false
protocol-members = false
exempt-names = ["__init__", "setUp"]
max-file-size = "32 MiB"
"""
    )
    config = load_config(tmp_path / "pyproject.toml", tmp_path)
    assert config.source == tmp_path / "pyproject.toml"
    assert config.selection == SelectionLayer(select=("KVR0",), extend_select=("KVR103",), ignore=("KVR002",))
    assert config.excludes == (*DEFAULT_EXCLUDES, "tests/fixtures")
    assert config.per_file_ignores == (("tests/**", ("KVR001",)),)
    assert not config.respect_gitignore
    assert config.force_exclude
    assert config.baseline == tmp_path / ".kvref-baseline.json"
    options = config.options
    assert options.override_import == "typing"
    assert not options.object_dunders and not options.abstract_implementations
    assert not options.protocol_members
    assert options.exempt_names == frozenset({"__init__", "setUp"})
    assert options.max_file_bytes == 32 * 1024 * 1024


def test_defaults_without_a_table(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    config = load_config(tmp_path / "pyproject.toml", tmp_path)
    assert config.selection == SelectionLayer()
    assert config.excludes == DEFAULT_EXCLUDES
    assert config.options.exempt_names == DEFAULT_EXEMPT_NAMES
    assert config.options.override_import == "typing_extensions"
    assert config.baseline is None


def test_exclude_replaces_the_default_list(tmp_path: Path) -> None:
    config = parse_config_table({"exclude": ["gen"]}, root=tmp_path)
    assert config.excludes == ("gen",)


def test_a_standalone_toml_file_holds_the_keys_at_top_level(tmp_path: Path) -> None:
    (tmp_path / "kvref.toml").write_text('select = ["KVR1"]\n')
    assert load_config(tmp_path / "kvref.toml", tmp_path).selection.select == ("KVR1",)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"selct": ["KVR0"]}, "unknown key 'selct' (allowed: " + ", ".join(CONFIG_KEYS) + ")"),
        ({"select": "KVR001"}, 'select must be a list of strings, e.g. ["KVR001"]'),
        ({"ignore": [1]}, "ignore must be a list of strings"),
        ({"override-import": "typing-extensions"}, "override-import must be one of 'typing_extensions', 'typing'"),
        ({"respect-gitignore": "yes"}, "respect-gitignore must be true or false"),
        ({"object-dunders": 1}, "object-dunders must be true or false"),
        ({"per-file-ignores": ["x"]}, "per-file-ignores must be a table"),
        ({"per-file-ignores": {"t/**": "KVR001"}}, "per-file-ignores.'t/**' must be a list of strings"),
        ({"baseline": 3}, "baseline must be a path string"),
        ({"max-file-size": "lots"}, 'max-file-size must be a positive number of bytes or a size such as "32 MiB"'),
        ({"max-file-size": 0}, "max-file-size must be a positive number of bytes"),
        ({"max-file-size": "3 parsecs"}, "max-file-size must be a positive number of bytes"),
        ({"max-file-size": True}, "max-file-size must be a positive number of bytes"),
    ],
)
def test_bad_values_name_the_key_and_the_allowed_values(
    tmp_path: Path, table: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config_table(table, root=tmp_path, where="pyproject.toml [tool.kvref]")
    assert str(raised.value).startswith("pyproject.toml [tool.kvref]: ")
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("value", "size"),
    [(4096, 4096), ("512KiB", 512 * 1024), ("1.5 mib", 1536 * 1024), ("2 GiB", 2 << 30), ("100", 100)],
)
def test_max_file_size_takes_bytes_or_a_size_with_a_unit(tmp_path: Path, value: object, size: int) -> None:
    assert parse_config_table({"max-file-size": value}, root=tmp_path).options.max_file_bytes == size


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.kvref\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(tmp_path / "pyproject.toml", tmp_path)


def _select(*layers: SelectionLayer) -> list[str]:
    return sorted(resolve_selection(FAKE_RULES, [(layer, "test") for layer in layers]))


def test_selection_defaults_leave_off_by_default_rules_out() -> None:
    assert _select() == ["KVR001", "KVR002", "KVR101", "KVR102"]
    assert _select(SelectionLayer(select=("KVR",))) == ["KVR001", "KVR002", "KVR101", "KVR102"]
    assert _select(SelectionLayer(extend_select=("KVR103",))) == CODES
    assert _select(SelectionLayer(select=("ALL",))) == CODES


def test_more_specific_selectors_win_within_a_layer() -> None:
    layer = SelectionLayer(select=("ALL", "KVR102"), ignore=("KVR1",))
    assert _select(layer) == ["KVR001", "KVR002", "KVR102"]
    # Equal specificity: ignore wins.
    assert _select(SelectionLayer(select=("KVR001",), ignore=("KVR001",))) == []


def test_a_later_layer_select_replaces_and_ignore_removes() -> None:
    config = SelectionLayer(select=("KVR0",))
    assert _select(config, SelectionLayer(select=("KVR101",))) == ["KVR101"]
    assert _select(config, SelectionLayer(ignore=("KVR001",))) == ["KVR002"]


def test_unknown_selector_names_where_and_the_allowed_values() -> None:
    with pytest.raises(ConfigError) as raised:
        _select(SelectionLayer(ignore=("E501",)))
    assert str(raised.value) == (
        "test: unknown rule selector 'E501' (allowed: ALL, a rule code "
        "(KVR001, KVR002, KVR101, KVR102, KVR103), or a prefix of one such as KVR0)"
    )


SELECTORS = st.sampled_from(["ALL", "KVR", "KVR0", "KVR1", "KVR10", *CODES])


@given(select=st.lists(SELECTORS, max_size=4), ignore=st.lists(SELECTORS, max_size=4))
def test_exact_codes_decide_against_prefixes(select: list[str], ignore: list[str]) -> None:
    enabled = resolve_selection(FAKE_RULES, [(SelectionLayer(select=tuple(select), ignore=tuple(ignore)), "t")])
    assert enabled <= set(CODES)
    for code in CODES:
        if code in ignore:
            assert code not in enabled
        elif code in select:
            assert code in enabled
        elif "ALL" not in select and not any(code.startswith(s) for s in select):
            assert code not in enabled
