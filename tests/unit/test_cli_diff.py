"""``reaper diff`` on the bundled sample exports and on recorded sweep inputs: output, exit codes, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import msgspec
import pytest

from reaper import decoders
from reaper.model import Evidence, SweepData
from tests.unit.test_cli import INPUTS, NOW, ROOT, SAMPLES, run_cli

ENFORCE = "rollout: {gce: enforcement, k8s: enforcement}\n"
# A quarantine of 2 minutes: every VM of the samples with a heartbeat older than that is stale. The budget is
# opened so that no hold hides it: project a's fresh VMs are deleted by the new config.
SHORT_QUARANTINE = ENFORCE + "gce: {max_job_timeout: 1m, slack: 1m}\nbudget: {max_stale_fraction: 1.0}\n"


def configs(tmp_path: Path, old: str, new: str) -> tuple[str, str]:
    paths = tmp_path / "base.yaml", tmp_path / "new.yaml"
    for path, text in zip(paths, (old, new), strict=True):
        path.write_text(text)
    return str(paths[0]), str(paths[1])


def run_diff(tmp_path: Path, old: str, new: str, *args: str) -> tuple[int, str]:
    return run_cli("diff", *configs(tmp_path, old, new), "--now", NOW, *INPUTS, *args)


def diff_json(tmp_path: Path, old: str, new: str, *args: str) -> tuple[int, dict]:
    code, out = run_diff(tmp_path, old, new, "--format", "json", *args)
    return code, json.loads(out)


def test_a_config_that_would_delete_a_fresh_vm_exits_3_and_names_it(tmp_path: Path) -> None:
    code, out = run_diff(tmp_path, ENFORCE, SHORT_QUARANTINE)
    assert code == 3
    verdict = out[out.index("would delete a resource the old config kept") :]
    named = [line.split()[3].split("/")[-1].rstrip(":") for line in verdict.splitlines()[1:]]
    assert "a-fresh" in named and "a-fresh-at-quarantine" in named
    line = next(line for line in verdict.splitlines() if "/a-fresh:" in line)
    assert "fresh, old: heartbeat 5 min old, quarantine 4 h: fresh" in line
    # In the table, the change carries its flag, both decisions and the reading.
    row = next(line for line in out.splitlines() if " a-fresh " in line).split()
    assert row[0] == "!" and row[6:10] == ["keep", "fresh", "delete", "heartbeat_stale"] and row[10] == "fresh"


def test_the_exit_code_reaches_the_shell(tmp_path: Path) -> None:
    """What a CI job sees: the process's status, through ``python -m reaper`` as through the console script."""
    old, new = configs(tmp_path, ENFORCE, SHORT_QUARANTINE)
    env = {"PYTHONPATH": str(ROOT / "plugins")}
    args = [sys.executable, "-m", "reaper", "diff", "--now", NOW, *INPUTS]
    dangerous = subprocess.run([*args, old, new], capture_output=True, text=True, env=env, timeout=60)
    assert dangerous.returncode == 3 and "a-fresh" in dangerous.stdout and dangerous.stderr == ""
    same = subprocess.run([*args, old, old], capture_output=True, text=True, env=env, timeout=60)
    assert (same.returncode, same.stdout.splitlines()[-1]) == (0, "no decision changes")


def test_a_change_that_only_deletes_stale_vms_exits_0_and_lists_them(tmp_path: Path) -> None:
    code, out = run_diff(tmp_path, ENFORCE + "rules: {heartbeat_stale: report}\n", ENFORCE)
    assert code == 0
    row = next(line for line in out.splitlines() if " a-stale " in line).split()
    assert row[0] == "gce" and row[5:9] == ["report", "heartbeat_stale", "delete", "heartbeat_stale"]
    assert row[9] == "stale"
    assert out.splitlines()[-1].endswith("none deletes a resource the old config kept while its liveness evidence "
                                         "is fresh or unknown")  # fmt: skip


def test_identical_configs_exit_0_with_no_decision_changes(tmp_path: Path) -> None:
    code, out = run_diff(tmp_path, ENFORCE, ENFORCE)
    assert code == 0 and out.splitlines()[-1] == "no decision changes"
    assert "phases: gce enforcement -> enforcement, k8s enforcement -> enforcement" in out


def test_json_shape(tmp_path: Path) -> None:
    code, result = diff_json(tmp_path, ENFORCE, SHORT_QUARANTINE)
    assert code == 3 and result["now"] == NOW
    assert result["old"]["phases"] == result["new"]["phases"] == {"gce": "enforcement", "k8s": "enforcement"}
    assert result["old"]["config"].endswith("base.yaml") and result["new"]["config"].endswith("new.yaml")
    change = next(c for c in result["changes"] if c["name"] == "a-fresh")
    assert set(change) == {
        *("target", "scope", "kind", "location", "name", "uid"),
        *("old", "new", "liveness", "widens", "dangerous"),
    }
    assert (change["old"]["action"], change["old"]["reason"]) == ("keep", "fresh")
    assert (change["new"]["action"], change["new"]["reason"]) == ("delete", "heartbeat_stale")
    assert change["liveness"]["state"] == "fresh" and change["liveness"]["read_by"] == "old"
    assert change["liveness"]["evidence"]["heartbeat_age_s"] == 300
    assert change["widens"] is change["dangerous"] is True
    assert result["dangerous"] == sum(c["dangerous"] for c in result["changes"]) > 0
    assert [c["dangerous"] for c in result["changes"]] == sorted(
        (c["dangerous"] for c in result["changes"]), reverse=True
    )


def test_html_renders_the_changes(tmp_path: Path) -> None:
    code, page = run_diff(tmp_path, ENFORCE, SHORT_QUARANTINE, "--format", "html")
    assert code == 3 and page.startswith("<!doctype html>") and page.endswith("</html>")
    assert "fails review (exit 3)" in page
    row = next(r for r in page.split("<tr>") if "<td>a-fresh</td>" in r)
    assert 'title="deletes what may be alive">!</span>' in row
    assert "heartbeat 5 min old, quarantine 4 h: fresh" in row and "as the old config reads it" in row
    _, same = run_diff(tmp_path, ENFORCE, ENFORCE, "--format", "html")
    assert "no decision changes" in same and "<table" not in same


def test_a_rollout_step_is_reviewed_in_each_configs_active_phase(tmp_path: Path) -> None:
    base = "rollout: {gce: report-only, k8s: report-only}\n"
    code, result = diff_json(tmp_path, base, ENFORCE)
    assert code == 0 and result["old"]["phases"]["gce"] == "report-only"
    widened = {c["name"] for c in result["changes"] if c["widens"]}
    assert {"a-stale", "a-unlabeled-old", "a-malformed-old", "sandbox-run-dead"} <= widened
    # --phase evaluates both in one phase: a change of the rollout alone then changes nothing.
    code, out = run_diff(tmp_path, base, ENFORCE, "--phase", "enforcement")
    assert code == 0 and out.splitlines()[-1] == "no decision changes"


def test_a_bad_second_config_names_its_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = configs(tmp_path, ENFORCE, "gce: {slack: soon}\n")
    code, out = run_cli("diff", old, new, *INPUTS)
    err = capsys.readouterr().err
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"invalid config {new}: gce.slack" in err and old not in err


def test_a_missing_config_names_its_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, _ = configs(tmp_path, ENFORCE, ENFORCE)
    code, out = run_cli("diff", old, str(tmp_path / "absent.yaml"), *INPUTS)
    assert code == 2 and out == "" and "absent.yaml: cannot read the file" in capsys.readouterr().err


# --- recorded sweep inputs ------------------------------------------------------------------------


def record(tmp_path: Path, name: str, data: SweepData) -> str:
    """A sweep input as ``gather_evidence`` writes it to the sweep store."""
    path = tmp_path / name
    path.write_bytes(msgspec.msgpack.encode(data))
    return str(path)


def sample_gce_input(tmp_path: Path, as_of: float | None) -> str:
    evidence = Evidence(writer_health=decoders.load_writer_health(SAMPLES / "writer-health.json"))
    return record(
        tmp_path, "gce.msgpack", SweepData(decoders.load_gce(SAMPLES / "gce-instances.json"), evidence, as_of)
    )


def test_a_recorded_sweep_input_is_diffed_as_of_its_sweep(tmp_path: Path) -> None:
    recorded = sample_gce_input(tmp_path, datetime.fromisoformat(NOW).timestamp())
    old, new = configs(tmp_path, ENFORCE, SHORT_QUARANTINE)
    code, out = run_cli("diff", old, new, "--recorded", recorded, "--format", "json")
    via_exports = run_cli(
        "diff", old, new, "--now", NOW, "--format", "json", *INPUTS[:2], "--writer-health", INPUTS[-1]
    )
    assert code == 3 and (code, json.loads(out)) == (via_exports[0], json.loads(via_exports[1]))
    assert json.loads(out)["now"] == NOW


def test_a_recorded_kubernetes_input_reads_as_kubernetes(tmp_path: Path) -> None:
    objects = decoders.load_k8s(SAMPLES / "k8s-objects.json", "prod")
    leases = decoders.load_leases(SAMPLES / "leases.json")
    keys = {o.labels.get("iterion.io/run-id") for o in objects} - {None}
    runs = decoders.load_runs(SAMPLES / "runs.json", keys)  # type: ignore[arg-type]  # None taken out by the set difference, which mypy does not narrow
    evidence = Evidence(leases=leases, runs=runs, swept=frozenset({("k8s", "prod")}))
    recorded = record(tmp_path, "k8s.msgpack", SweepData(objects, evidence, datetime.fromisoformat(NOW).timestamp()))
    old, new = configs(tmp_path, ENFORCE + "rules: {sandbox_orphan: report}\n", ENFORCE)
    code, out = run_cli("diff", old, new, "--recorded", recorded, "--format", "json")
    widened = {(c["scope"], c["name"]) for c in json.loads(out)["changes"] if c["widens"]}
    assert code == 0 and ("prod", "sandbox-run-dead") in widened and ("prod", "sandbox-run-gone") in widened


def test_evaluate_reads_a_recorded_input_too(tmp_path: Path) -> None:
    recorded = sample_gce_input(tmp_path, datetime.fromisoformat(NOW).timestamp())
    code, out = run_cli("evaluate", "--phase", "enforcement", "--recorded", recorded, "--format", "json")
    deleted = {d["name"] for d in json.loads(out)["decisions"] if d["action"] == "delete"}
    assert code == 0 and deleted == {"a-stale", "a-terminated", "a-malformed-old", "a-unlabeled-old"}


def test_a_recorded_input_without_as_of_is_read_as_of_its_evidence(tmp_path: Path) -> None:
    # A file a sweep wrote before as_of was recorded: the time its evidence was read.
    evidence = Evidence(observed_until=datetime.fromisoformat(NOW).timestamp())
    recorded = record(tmp_path, "old.msgpack", SweepData(decoders.load_gce(SAMPLES / "gce-instances.json"), evidence))
    code, out = run_cli("evaluate", "--recorded", recorded, "--format", "json")
    assert code == 0 and json.loads(out)["now"] == NOW


@pytest.mark.parametrize(
    ("content", "extra", "expected"),
    [
        (b"\xc1", (), "not valid MessagePack"),
        (msgspec.msgpack.encode({"resources": [{"type": "instance"}], "evidence": {}}), (), "expected a sweep input"),
        (msgspec.msgpack.encode([1, 2]), (), "expected a sweep input"),
        (
            msgspec.msgpack.encode(SweepData([], Evidence())),
            ("--gce", str(SAMPLES / "gce-instances.json")),
            "not to be combined with --gce",
        ),
    ],
    ids=["not-msgpack", "bad-resource", "not-a-sweep-input", "with-exports"],
)
def test_a_bad_recorded_input_is_one_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, extra: tuple[str, ...], expected: str
) -> None:
    path = tmp_path / "sweep-input.msgpack"
    path.write_bytes(content)
    old, new = configs(tmp_path, ENFORCE, ENFORCE)
    code, out = run_cli("diff", old, new, "--recorded", str(path), *extra)
    err = capsys.readouterr().err
    assert code == 2 and out == "" and err.count("\n") == 1
    assert str(path) in err and "--recorded" in err and expected in err


def test_a_recorded_input_in_a_shared_store_is_copied_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = configs(tmp_path, ENFORCE, ENFORCE)
    code, _ = run_cli("diff", old, new, "--recorded", "gs://bucket/reaper_gce_enforcement/r/0/sweep-input.msgpack")
    assert code == 2 and "copy it from the sweep store first" in capsys.readouterr().err
    recorded = sample_gce_input(tmp_path, None)
    assert run_cli("diff", old, new, "--now", NOW, "--recorded", f"file://{recorded}")[0] == 0


def test_a_recorded_input_fails_a_selector_that_takes_in_more_than_it_listed(tmp_path: Path) -> None:
    recorded = sample_gce_input(tmp_path, datetime.fromisoformat(NOW).timestamp())
    old, new = configs(tmp_path, ENFORCE, ENFORCE + "gce: {selector: {env: ci}}\n")
    code, out = run_cli("diff", old, new, "--recorded", recorded)
    assert code == 3 and "the recorded input was listed under the old config's selection" in out
    assert "gce.selector" in out
    code, out = run_cli("diff", old, new, "--recorded", recorded, "--format", "json")
    assert code == 3 and json.loads(out)["unlisted"][0].startswith("gce.selector")
