"""Every file in dags/ imports cleanly under Airflow's own DagBag, with the conventions the project keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    # Airflow 3.3.2: DagBag has no include_examples argument; examples are off via AIRFLOW__CORE__LOAD_EXAMPLES.
    return DagBag(dag_folder=str(DAGS))


def test_every_dag_file_imports_without_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert dagbag.dags, "dags/ holds no DAG"


def test_every_dag_file_is_parsed(dagbag) -> None:
    files = {Path(dag.fileloc).name for dag in dagbag.dags.values()}
    assert files == {p.name for p in DAGS.glob("*.py")}


def test_dags_are_tagged_and_do_not_catch_up(dagbag) -> None:
    for dag in dagbag.dags.values():
        assert "reaper" in dag.tags
        assert dag.catchup is False
