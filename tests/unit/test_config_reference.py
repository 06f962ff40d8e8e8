"""The config reference (``reaper config-reference``): generated from the model, committed in docs/reference.md."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from reaper import config_reference
from reaper.cli import main
from reaper.config import ConfigError, Settings, parse_settings
from tests.helpers import ROOT

REFERENCE = ROOT / "docs" / "reference.md"


def test_the_committed_table_is_what_the_model_generates() -> None:
    assert config_reference.committed(REFERENCE) == config_reference.table(), (
        "docs/reference.md's config table differs from the config model (plugins/reaper/config.py); "
        "regenerate it with: .venv/bin/reaper config-reference --write docs/reference.md"
    )


def test_every_key_has_a_description() -> None:
    assert config_reference.missing_descriptions() == [], (
        "give each of these keys a docstring in plugins/reaper/config.py (the line after the field): "
        "it is the key's description in docs/reference.md"
    )


def test_a_config_spelling_every_default_as_the_table_does_is_the_default_config() -> None:
    # Every key is real (an unknown one is refused) and every default is written so the YAML reads it back
    # as that default: `"{run}"` quoted, durations in their short form, labels as key=value.
    data: dict[str, object] = {}
    for key, kind, default, _ in config_reference.rows():
        if kind == "section" or "[]." in key:  # a list's entries: the list's own default (none) stands
            continue
        *sections, leaf = key.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})  # type: ignore[assignment]  # JSON data typed object: its shape is this code's own
        node[leaf] = yaml.safe_load(default.strip("`"))
    assert parse_settings(data, "the table") == Settings()


def test_types_bounds_and_reasons_come_from_the_annotations() -> None:
    rows = {key: (kind, default, text) for key, kind, default, text in config_reference.rows()}
    kind, default, text = rows["k8s.min_age"]
    assert (kind, default) == ("duration, at least 1m", "`5m`")
    assert text.endswith("Bound: a sandbox younger may not have its lease or run record yet.")
    # The bound in the table is the one the config enforces, with the same reason in its message.
    with pytest.raises(ConfigError, match=r"k8s\.min_age: expected at least 1m \(a sandbox younger"):
        parse_settings({"k8s": {"min_age": "30s"}}, "x")
    assert rows["gce.list_concurrency"][0] == "integer, at least 1, at most 64"
    assert rows["gce.quota.share"][:2] == ("number, more than 0, at most 0.5", "`0.2`")
    assert rows["rules.residual_group"][:2] == ('`"off"` or `report`', "`report`")
    # A list of entries: the list, then each entry's keys with their own defaults.
    assert rows["notifications.channels"][:2] == ("list of entries (`notifications.channels[]` below)", "`[]`")
    assert rows["notifications.channels[].kind"][:2] == ("one of `smtp`, `slack`, `slack_webhook`", "required")
    assert rows["notifications.channels[].events"][1] == "`[held, failed, deleted]`"
    assert rows["k8s.lease_source"][0] == "one of `nats`, `mongo`, `none`"
    assert rows["gce.opt_out_label"][:2] == ("label `key=value`", "`reaper_keep=true`")
    assert rows["k8s.nats_leases.key_template"][1] == '`"{run}"`'  # bare {run} is a YAML mapping
    assert rows["gce.quota.limits"][0] == "section"
    assert Settings().gce.max_job_timeout == timedelta(hours=3) and rows["gce.max_job_timeout"][:2] == (
        "duration, more than 0s",
        "`3h`",
    )


def test_the_cli_prints_the_table_and_writes_it_between_the_markers(tmp_path: Path) -> None:
    out = io.StringIO()
    assert main(["config-reference"], out) == 0
    assert out.getvalue() == config_reference.table()

    doc = tmp_path / "reference.md"
    doc.write_text(f"# Reference\n\nbefore\n{config_reference.BEGIN}\n| stale |\n{config_reference.END}\nafter\n")
    assert main(["config-reference", "--write", str(doc)], io.StringIO()) == 0
    text = doc.read_text()
    assert text.startswith("# Reference\n\nbefore\n") and text.endswith(f"{config_reference.END}\nafter\n")
    assert "| stale |" not in text and config_reference.committed(doc) == config_reference.table()


def test_writing_into_a_file_without_the_markers_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "reference.md"
    doc.write_text("# Reference\n")
    assert main(["config-reference", "--write", str(doc)], io.StringIO()) == 2
    assert doc.read_text() == "# Reference\n"
    assert "expected the lines" in capsys.readouterr().err
