"""docs/runbook.md against the code: every metric, DAG id and config key it cites exists, and
every alert has a section its ``runbook_url`` anchor finds. An on-call reads these names under pressure:
one that names nothing (a metric never pushed, a DAG id with dashes) costs minutes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from reaper import alert_rules
from reaper.config import DEFAULT_CONFIG, RulesConfig, Settings, load_config
from reaper.model import dag_id_of
from reaper.sweep.factory import PHASES

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
# Series the runbook may cite that no reaper code pushes: Prometheus's own (ALERTS, up) and the Pushgateway's.
BUILT_IN = {"ALERTS", "ALERTS_FOR_STATE", "up", "push_time_seconds", "push_failure_time_seconds"}
PLACEHOLDERS = {"<target>": ("gce", "k8s"), "<rule>": tuple(RulesConfig.model_fields)}


def _prose(text: str) -> str:
    """The runbook without its fenced blocks (a YAML route, a shell command)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", _prose(text).replace("\n", " "))


def metrics_of_the_code() -> set[str]:
    """Every series the reaper pushes (reaper/metrics.py), and those of other exporters the rules read."""
    pushed = set(re.findall(r'_gauge\(\s*"(\w+)"', (ROOT / "plugins" / "reaper" / "metrics.py").read_text()))
    health = Settings().gce.writer_health
    read = {alert_rules.RESTARTS, alert_rules.ACTIONS, alert_rules.LAST_SUCCESS, alert_rules.PUSH_TIME}
    read |= {health.last_pass_metric, health.failed_passes_metric, health.passes_metric}
    return pushed | read


def dag_ids_of_the_dags() -> set[str]:
    """The DAG ids dags/ makes: the factory's for each target a DAG file builds, and those written out."""
    found: set[str] = set()
    for path in (ROOT / "dags").glob("*.py"):
        text = path.read_text()
        for target in re.findall(r'build_dags\(.*?"(gce|k8s)"\)', text):
            found |= {dag_id_of(target, phase) for phase in PHASES[target]}
        found |= set(re.findall(r'dag_id="([\w.-]+)"', text))
    return found


def _is_key(model: type[BaseModel], path: list[str]) -> bool:
    field = model.model_fields.get(path[0])
    if field is None:
        return False
    if len(path) == 1:
        return True
    inner = field.annotation
    return isinstance(inner, type) and issubclass(inner, BaseModel) and _is_key(inner, path[1:])


def _expand(key: str) -> list[str]:
    for placeholder, values in PLACEHOLDERS.items():
        if placeholder in key:
            return [k for v in values for k in _expand(key.replace(placeholder, v))]
    return [key]


TEXT = RUNBOOK.read_text()
SPANS = _spans(TEXT)


def test_the_code_sets_are_read() -> None:
    """The sets the runbook is checked against are the real ones (a broken regex would make every check pass)."""
    assert {"reaper_scope_hold", "reaper_last_sweep_retire_failures"} <= metrics_of_the_code()
    assert {"reaper_gce_report_only", "reaper_k8s_enforcement", "reaper_config_check"} <= dag_ids_of_the_dags()
    assert "reaper_k8s_terminated_cleanup" not in dag_ids_of_the_dags()
    assert _is_key(Settings, ["gce", "writer_health", "failing_window"]) and not _is_key(Settings, ["gce", "nope"])


def test_every_reaper_name_the_runbook_cites_is_a_metric_or_a_dag() -> None:
    """``reaper_scope_findings`` (never pushed) and ``reaper_gce_report-only`` (a DAG id with the phase's dash)
    were cited; each ``reaper_`` name in a code span must be a pushed metric or a DAG id of dags/."""
    known = metrics_of_the_code() | dag_ids_of_the_dags()
    cited = {name for span in SPANS for name in re.findall(r"\breaper_[\w<>.-]*", span)}
    assert cited and cited - known == set()


def test_every_series_the_runbook_cites_exists() -> None:
    """A selector (``name{...}``) or a name ending the way metrics do names a series of the code or a built-in."""
    known = metrics_of_the_code() | BUILT_IN
    cited = {
        m
        for span in _spans(TEXT) + re.findall(r"^```.*?^```", TEXT, flags=re.S | re.M)
        for m in re.findall(r"\b([A-Za-z_:][\w:]*)\{", span) + re.findall(r"\b(\w+_(?:total|seconds))\b", span)
    }
    assert {"up", "push_time_seconds", "reaper_last_attempt_timestamp_seconds"} <= cited
    assert cited - known == set()


def test_every_config_key_the_runbook_cites_exists() -> None:
    """A dotted name whose first part is a config section is a key of plugins/reaper/config.py's model
    (``<target>`` and ``<rule>`` stand for each target and rule)."""
    keys = [span for span in SPANS if re.fullmatch(r"[a-z_<>]+(\.[a-z0-9_<>]+)+", span)]
    cited = [key for span in keys for key in _expand(span) if key.split(".")[0] in Settings.model_fields]
    assert "gce.writer_health.failing_window" in cited and "airflow.gce_schedule" in cited
    assert [key for key in cited if not _is_key(Settings, key.split("."))] == []


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub and GitLab render it: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


HEADINGS = re.findall(r"^#{2,} (.+)$", _prose(TEXT), flags=re.M)


RULES = alert_rules.rules(load_config(DEFAULT_CONFIG))["groups"][0]["rules"]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: "-".join([r["alert"], *r["labels"].values()]))
def test_every_alert_has_a_section_its_runbook_url_finds(rule: alert_rules.Rule) -> None:
    assert rule["alert"] in HEADINGS, f"docs/runbook.md has no section ## {rule['alert']}"
    anchor = str(rule["annotations"]["runbook_url"]).rsplit("#", 1)[1]
    assert anchor in {_anchor(h) for h in HEADINGS}


def test_every_section_the_runbook_refers_to_exists() -> None:
    refs = re.findall(r'[Ss]ee "([^"]+)"', _prose(TEXT).replace("\n", " "))
    assert "Recovering from a mass abandonment" in refs
    assert set(refs) <= set(HEADINGS)


def test_the_writer_failing_window_is_the_key_the_rule_reads() -> None:
    """HeartbeatWriterFailing reads gce.writer_health.failing_window, not gce.writer_stale_after (the stale alert's)."""
    section = TEXT.split("## HeartbeatWriterFailing", 1)[1].split("\n## ", 1)[0]
    assert "`gce.writer_health.failing_window`" in section and "writer_stale_after" not in section
    window = alert_rules.prom_duration(load_config(DEFAULT_CONFIG).gce.writer_health.failing_window)
    [failing] = [r for r in RULES if r["alert"] == "HeartbeatWriterFailing"]
    assert f"[{window}]" in failing["expr"]
