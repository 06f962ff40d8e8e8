"""``reaper evaluate`` on the bundled realistic exports, for every phase, and on bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from reaper.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "include" / "samples"
NOW = "2026-11-29T12:00:00Z"
INPUTS = [
    "--gce",
    str(SAMPLES / "gce-instances.json"),
    "--k8s",
    str(SAMPLES / "k8s-objects.json"),
    "--runs",
    str(SAMPLES / "runs.json"),
    "--leases",
    str(SAMPLES / "leases.json"),
    "--writer-health",
    str(SAMPLES / "writer-health.json"),
]

K, R, X = "keep", "report", "delete"
# name -> action per phase (telemetry, terminated-cleanup, report-only, enforcement)
GCE_EXPECTED = {
    "a-fresh": (K, K, K, K),
    "a-fresh-at-quarantine": (K, K, K, K),
    "a-stale": (K, K, R, X),
    "a-terminated": (K, X, X, X),
    "a-terminated-in-grace": (K, K, K, K),
    "a-future-heartbeat": (K, K, R, R),
    "a-malformed-old": (K, K, R, X),
    "a-unlabeled-old": (K, K, R, X),
    "a-unlabeled-young": (K, K, K, K),
    "a-opted-out-stale": (K, K, K, K),
    "b-fresh": (K, K, K, K),
    "b-fresh-2": (K, K, K, K),
    "b-stale-writer-failing": (K, K, R, R),
    "c-fresh": (K, K, K, K),
    **{f"c-stale-over-budget-{i}": (K, K, R, R) for i in range(1, 5)},
}
RUN_EXPECTED = {
    "run-live": (K, K, K, K),
    "run-dead": (K, K, R, X),
    "run-gone": (K, K, R, X),
    "run-active": (K, K, R, R),
    "run-egress": (K, K, R, R),
    "run-young": (K, K, K, K),
    "run-protected": (K, K, K, K),
}
PHASES = ["telemetry", "terminated-cleanup", "report-only", "enforcement"]


def run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(args), out=out)
    return code, out.getvalue()


def evaluate_json(phase: str, *extra: str, inputs: Sequence[str] = INPUTS) -> dict:
    code, out = run_cli("evaluate", "--now", NOW, "--phase", phase, "--format", "json", *inputs, *extra)
    assert code == 0
    return json.loads(out)


@pytest.mark.parametrize("index", range(4), ids=PHASES)
def test_samples_give_the_right_answer_for_every_phase(index: int) -> None:
    result = evaluate_json(PHASES[index])
    gce = {d["name"]: d["action"] for d in result["decisions"] if d["target"] == "gce"}
    assert gce == {name: actions[index] for name, actions in GCE_EXPECTED.items()}
    k8s: dict[str, set[str]] = {}
    for d in result["decisions"]:
        if d["target"] == "k8s":
            run = next((r for r in RUN_EXPECTED if d["name"].startswith(f"sandbox-{r}")), d["name"])
            k8s.setdefault(run, set()).add(d["action"])
    expected = {run: {actions[index]} for run, actions in RUN_EXPECTED.items()}
    expected["sandbox-stray-secret"] = {K if index < 2 else R}
    assert k8s == expected


def test_sample_reasons_in_enforcement() -> None:
    reasons = {d["name"]: (d["rule"], d["reason"]) for d in evaluate_json("enforcement")["decisions"]}
    assert reasons["a-stale"] == ("heartbeat_stale", "heartbeat_stale")
    assert reasons["a-malformed-old"] == ("unlabeled_age", "unlabeled_age")
    assert reasons["a-future-heartbeat"] == ("heartbeat_stale", "heartbeat_in_future")
    assert reasons["b-stale-writer-failing"] == ("heartbeat_stale", "writer_unhealthy")
    assert reasons["c-stale-over-budget-1"] == ("heartbeat_stale", "budget_exceeded")
    assert reasons["sandbox-run-active"][1] == "lease_absent_run_active"
    assert reasons["sandbox-run-egress"][1] == "results_egress_in_progress"
    assert reasons["sandbox-run-young"][1] == "min_age"
    assert reasons["sandbox-stray-secret"][1] == "run_label_missing"


def test_json_shape() -> None:
    result = evaluate_json("report-only")
    assert result["phase"] == "report-only" and result["now"] == NOW
    assert set(result["decisions"][0]) >= {"target", "scope", "kind", "name", "uid", "action", "rule", "reason"}
    scopes = {(s["target"], s["scope"]): s for s in result["scopes"]}
    assert scopes[("gce", "ci-runners-b")]["verdict"] == "writer_unhealthy"
    assert scopes[("gce", "ci-runners-c")]["verdict"] == "budget_exceeded"
    assert scopes[("k8s", "default")]["verdict"] == "ok"
    assert result["census"]["gce"]["ci-runners-a"]["instances"] == 10
    uids = [d["uid"] for d in result["decisions"]]
    assert len(uids) == len(set(uids)), "exactly one decision per in-scope resource"


def test_out_of_selector_instances_do_not_appear() -> None:
    names = {d["name"] for d in evaluate_json("enforcement")["decisions"]}
    assert not names & {"a-unselected-no-labels", "a-unselected-other", "unmanaged-web"}


def test_the_table_gives_each_reason_in_words_beside_its_code() -> None:
    from reaper.config import load_config
    from reaper.report.reasons import Limits, explain

    decisions = [d for d in evaluate_json("enforcement")["decisions"] if d["action"] != "keep"]
    _, table = run_cli("evaluate", "--now", NOW, "--phase", "enforcement", *INPUTS)
    lines = table.splitlines()
    limits = Limits.of(load_config(None))
    for d in decisions:
        sentence = explain(d["reason"], d.get("evidence"), limits)
        assert sentence != d["reason"], f"{d['reason']} has no sentence"
        line = next(line for line in lines if f" {d['name']} " in line)
        assert f" {d['reason']} " in line and line.rstrip().endswith(sentence), line


def test_secret_data_is_never_printed() -> None:
    secret = json.loads((SAMPLES / "k8s-objects.json").read_text())["items"][2]["data"]["credentials.json"]
    for fmt in ("json", "table"):
        _, out = run_cli("evaluate", "--now", NOW, "--format", fmt, *INPUTS)
        assert secret not in out and "credentials.json" not in out


def test_missing_evidence_means_unknown_and_keep() -> None:
    samples = ("--gce", str(SAMPLES / "gce-instances.json"), "--k8s", str(SAMPLES / "k8s-objects.json"))
    decisions = evaluate_json("enforcement", inputs=samples)["decisions"]
    deleted = {d["name"] for d in decisions if d["action"] == "delete"}
    # Without writer health, no heartbeat delete; without leases, no Kubernetes delete.
    assert deleted == {"a-terminated", "a-malformed-old", "a-unlabeled-old"}
    assert {d["reason"] for d in decisions if d["target"] == "k8s" and d["action"] == "report"} == {
        "lease_unknown",
        "run_label_missing",
    }


def test_table_lists_scopes_and_actions() -> None:
    code, out = run_cli("evaluate", "--now", NOW, "--phase", "enforcement", *INPUTS)
    assert code == 0
    assert "ci-runners-c  budget_exceeded" in out
    line = next(line for line in out.splitlines() if " a-stale " in line)
    assert line.split()[0] == "delete" and " heartbeat_stale " in line


def test_cluster_names_the_k8s_scope() -> None:
    result = evaluate_json("enforcement", "--cluster", "prod-eu")
    assert {d["scope"] for d in result["decisions"] if d["target"] == "k8s"} == {"prod-eu"}


def test_config_controls_the_policy(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("gce: {protected_projects: [ci-runners-a]}\nk8s: {min_age: 3h}\n")
    result = evaluate_json("enforcement", "--config", str(cfg))
    assert not [d for d in result["decisions"] if d["action"] == "delete"]


# --- bad input ------------------------------------------------------------------------------


def _bad(tmp_path: Path, option: str, content: str, capsys: pytest.CaptureFixture[str]) -> str:
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, out = run_cli("evaluate", "--now", NOW, option, str(path))
    err = capsys.readouterr().err
    assert code == 2 and out == ""
    assert str(path) in err and option in err
    return err


@pytest.mark.parametrize(
    ("option", "content", "expected"),
    [
        ("--gce", "[{not json", "not valid JSON"),
        ("--gce", '{"kind": "List"}', "Expected `array`"),
        ("--gce", '[{"name": "x"}]', "instance x: expected a name, a status and a numeric id"),
        (
            "--gce",
            '[{"name": "x", "id": "1", "status": "RUNNING", "zone": "projects/p/zones/z",'
            ' "creationTimestamp": "yesterday"}]',
            "creationTimestamp",
        ),
        (
            "--gce",
            '[{"name": "x", "id": "1", "status": "RUNNING", "zone": "us-east1-b",'
            ' "creationTimestamp": "2026-11-01T00:00:00Z"}]',
            "no project",
        ),
        (
            "--gce",
            '[{"name": "x", "id": "1", "status": "RUNNING", "zone": "projects/p/zones/z",'
            ' "creationTimestamp": "2026-11-01T00:00:00"}]',
            "with an offset",
        ),
        (
            "--gce",
            '[{"name": "x", "id": "1", "status": "RUNNING", "zone": "projects/p/zones/z",'
            ' "creationTimestamp": "2026-11-01T00:00:00Z", "labels": {"a": 1}}]',
            "$[0].labels",
        ),
        ("--k8s", "[]", "Expected `object`"),
        ("--k8s", '{"items": [{"kind": "Pod", "metadata": {"name": "p"}}]}', "$.items[0].metadata"),
        ("--runs", '[{"status": "failed"}]', "expected a JSON list of documents with an _id"),
        ("--runs", '{"r1": "failed"}', "expected a JSON list of documents with an _id"),
        ("--runs", '[{"_id": {"$oid": "run-dead"}, "status": "failed"}]', "not valid Extended JSON"),
        ("--leases", "[1, 2]", "Expected `str`"),
        ("--leases", '{"run-live": true}', "Expected `array`"),
        (
            "--writer-health",
            '[{"manager": "m", "project": "p", "last_pass": "now", "failing": false}]',
            "$[0].last_pass",
        ),
        ("--writer-health", '[{"manager": "m", "project": "p", "last_pass": 1}]', "failing"),
    ],
)
def test_bad_input_is_one_clear_message(tmp_path, capsys, option: str, content: str, expected: str) -> None:
    assert expected in _bad(tmp_path, option, content, capsys)


def test_unreadable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli("evaluate", "--gce", str(tmp_path / "missing.json"))
    assert code == 2 and out == "" and "cannot read the file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("budget: {max_stale_fraction: 2}\n", "budget.max_stale_fraction: expected"),
        ("gce: {slack: 99999999999d}\n", "gce.slack: expected a duration of at most 24855d"),
        ("gce: {slack: 1h}\ngce: {slack: 2h}\n", "gce: duplicate key at line 2 (first at line 1)"),
    ],
)
def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    code, out = run_cli("evaluate", "--config", str(cfg), *INPUTS)
    err = capsys.readouterr().err
    assert code == 2 and out == "" and err.count("\n") == 1 and expected in err and str(cfg) in err


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        ("yesterday", "expected an RFC 3339 timestamp"),
        ("2026-11-29T12:00:00", "expected a timestamp with an offset"),
        ("9999-12-31T23:59:59-23:59", "expected a time between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z"),
        ("0001-01-01T00:00:00+23:59", "expected a time between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z"),
    ],
)
def test_bad_now_is_one_line_and_exits_2(now: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    with pytest.raises(SystemExit) as info:
        main(["evaluate", "--now", now], out=out)
    err = capsys.readouterr().err
    assert info.value.code == 2 and out.getvalue() == ""
    assert err.count("\n") == 1 and "--now" in err and expected in err


# --- duplicate evidence and list shapes -----------------------------------------------------

OID = "65a1f0c2e4b0a1b2c3d4e5f6"


def _sample_items() -> list[dict[str, Any]]:
    return json.loads((SAMPLES / "k8s-objects.json").read_text())["items"]


def _k8s_decisions(
    tmp_path: Path, listings: Sequence[Mapping[str, object]], runs: object = None, leases: object = None
) -> dict[str, tuple[str, str]]:
    """(action, reason) per ``kind/name`` in enforcement; the sample's runs and leases where not given."""
    inputs: list[str] = []
    for i, listing in enumerate(listings):
        path = tmp_path / f"k8s-{i}.json"
        path.write_text(json.dumps(listing))
        inputs += ["--k8s", str(path)]
    for option, content, sample in (("--runs", runs, "runs.json"), ("--leases", leases, "leases.json")):
        path = SAMPLES / sample
        if content is not None:
            path = tmp_path / sample
            path.write_text(json.dumps(content))
        inputs += [option, str(path)]
    decisions = evaluate_json("enforcement", inputs=inputs)["decisions"]
    return {f"{d['kind']}/{d['name']}": (d["action"], d["reason"]) for d in decisions}


def _dead_run(tmp_path: Path, runs: Sequence[object], key: str = "run-dead") -> set[tuple[str, str]]:
    """The (action, reason)s of the sample's old run ``run-dead``, relabelled ``key``, with no lease held."""
    items = [i for i in _sample_items() if i["metadata"].get("labels", {}).get("iterion.io/run-id") == "run-dead"]
    for item in items:
        item["metadata"]["labels"]["iterion.io/run-id"] = key
    return set(_k8s_decisions(tmp_path, [{"kind": "List", "items": items}], runs=runs, leases=[]).values())


def test_runs_that_disagree_on_one_key_make_it_unknown(tmp_path: Path) -> None:
    runs = [{"_id": "run-dead", "status": "running"}, {"_id": "run-dead", "status": "succeeded"}]
    assert _dead_run(tmp_path, runs) == {("report", "store_unknown")}
    # Either record alone would decide it: each order of the two must stay unknown.
    assert _dead_run(tmp_path, runs[::-1]) == {("report", "store_unknown")}


def test_identical_duplicate_runs_are_one_record(tmp_path: Path) -> None:
    assert _dead_run(tmp_path, [{"_id": "run-dead", "status": "failed"}] * 2) == {("delete", "sandbox_orphan")}


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ([{"_id": {"$oid": OID}, "status": "failed"}, {"_id": OID, "status": "failed"}], ("delete", "sandbox_orphan")),
        ([{"_id": {"$oid": OID}, "status": "running"}, {"_id": OID, "status": "failed"}], ("report", "store_unknown")),
        ([{"_id": OID, "status": "failed"}, {"_id": {"$oid": OID}, "status": "running"}], ("report", "store_unknown")),
    ],
)
def test_an_object_id_and_its_hex_string_are_one_run(tmp_path: Path, runs: list[object], expected: tuple) -> None:
    assert _dead_run(tmp_path, runs, key=OID) == {expected}


def test_duplicate_leases_are_harmless(tmp_path: Path) -> None:
    decisions = _k8s_decisions(tmp_path, [{"kind": "List", "items": _sample_items()}], leases=["run-live"] * 2)
    assert {reason for name, (_, reason) in decisions.items() if "sandbox-run-live" in name} == {"lease_held"}


def test_typed_lists_carry_their_items_kind(tmp_path: Path) -> None:
    # What the API and client libraries return: PodList, SecretList, NetworkPolicyList, items without kind.
    typed = []
    for kind in ("Pod", "Secret", "NetworkPolicy"):
        items = [{k: v for k, v in i.items() if k != "kind"} for i in _sample_items() if i["kind"] == kind]
        typed.append({"kind": f"{kind}List", "apiVersion": "v1", "items": items})
    expected = _k8s_decisions(tmp_path, [{"kind": "List", "items": _sample_items()}])
    assert len(expected) == 29
    assert _k8s_decisions(tmp_path, typed) == expected


def test_items_of_other_kinds_are_still_ignored(tmp_path: Path) -> None:
    config_map = {"metadata": {"name": "cm", "uid": "u1", "creationTimestamp": "2026-11-01T00:00:00Z"}}
    listings = (
        {"kind": "ConfigMapList", "items": [config_map]},
        {"kind": "List", "items": [{"kind": "ConfigMap", **config_map}]},
    )
    assert _k8s_decisions(tmp_path, listings) == {}


def _meta(name: str) -> dict[str, object]:
    return {"name": name, "namespace": "ci", "uid": name, "creationTimestamp": "2026-11-01T00:00:00Z"}


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        (
            {"kind": "List", "items": [{"kind": "Pod", "metadata": _meta("a")}, {"metadata": _meta("b")}]},
            "$.items[1] (ci/b): no kind, and the list (List) does not name one",
        ),
        ({"items": [{"metadata": _meta("a")}]}, "$.items[0] (ci/a): no kind, and the list (no kind) does not name one"),
        (
            {"kind": "PartialObjectMetadataList", "items": [{"kind": "PartialObjectMetadata", "metadata": _meta("s")}]},
            "$.items[0] (ci/s): no kind, and the list (PartialObjectMetadataList) does not name one",
        ),
        (
            {"kind": "PartialObjectMetadataList", "items": [{"metadata": _meta("s")}]},
            "$.items[0] (ci/s): no kind, and the list (PartialObjectMetadataList) does not name one",
        ),
        (
            {"kind": "PodList", "items": [{"kind": "Secret", "metadata": _meta("s")}]},
            "$.items[0] (ci/s): kind Secret in a PodList",
        ),
    ],
)
def test_an_item_whose_kind_cannot_be_known_is_an_input_error(tmp_path, capsys, listing: dict, expected: str) -> None:
    # Skipping it would print "no orphans" for a file the reaper could not read.
    assert expected in _bad(tmp_path, "--k8s", json.dumps(listing), capsys)


def test_python_dash_m_and_console_script_agree() -> None:
    args = ["evaluate", "--now", NOW, "--format", "json", *INPUTS]
    env_path = {"PYTHONPATH": str(ROOT / "plugins")}
    via_module = subprocess.run(
        [sys.executable, "-m", "reaper", *args], capture_output=True, text=True, env=env_path, check=True
    )
    assert json.loads(via_module.stdout) == evaluate_json("report-only")


@pytest.mark.parametrize(
    ("key", "record_id"),
    [
        ("123", 123),  # the same number as an int: not a documented form of the key
        ("123", {"$numberLong": "123"}),
        (OID.upper(), {"$oid": OID}),  # an ObjectId under another spelling of the label
    ],
    ids=["int", "long", "upper-case-hex"],
)
def test_runs_file_follows_the_run_stores_key_forms(tmp_path: Path, key: str, record_id: object) -> None:
    # Review finding: the CLI read {"_id": 123} as run "123" and a $oid under any spelling as a match,
    # while the DAG's run store calls both unknown: the what-if promised deletes the sweep never makes.
    assert _dead_run(tmp_path, [{"_id": record_id, "status": "running"}], key=key) == {("report", "store_unknown")}


def test_help_names_every_command_and_version_matches_the_project(capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    from reaper import __version__

    with pytest.raises(SystemExit) as helped:
        main(["--help"])
    assert helped.value.code == 0
    text = capsys.readouterr().out
    assert all(command in text for command in ("evaluate", "diff", "check", "alert-rules", "metrics-retire"))
    with pytest.raises(SystemExit):
        main(["--version"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"reaper {project}" and __version__ == project


def test_output_cut_short_by_its_reader_ends_quietly() -> None:
    """``reaper evaluate ... | head`` ended in a BrokenPipeError traceback. Here the reader is gone
    before the first write (its end of the pipe closed), so every write meets a closed pipe."""
    import os

    args = [sys.executable, "-m", "reaper", "evaluate", "--now", NOW, "--format", "json", *INPUTS]
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            args,
            stdout=write,
            capture_output=False,
            stderr=subprocess.PIPE,
            timeout=60,
            env={"PYTHONPATH": str(ROOT / "plugins")},
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr.decode()) == (0, "")


@pytest.mark.parametrize(
    ("option", "sample", "expected"),
    [
        ("--gce", "k8s-objects.json", "expected a gcloud export (gcloud compute instances list --format=json"),
        ("--k8s", "gce-instances.json", "expected a kubectl export (kubectl get pods,secrets,networkpolicies"),
    ],
)
def test_an_export_of_the_other_kind_says_what_the_option_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, sample: str, expected: str
) -> None:
    """A kubectl List given to --gce read "Expected `array`, got `object`", the decoder's words."""
    err = _bad(tmp_path, option, (SAMPLES / sample).read_text(), capsys)
    assert expected in err and err.count("\n") == 1
