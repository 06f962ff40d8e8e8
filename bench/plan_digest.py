"""Digest of the plans the policy makes (``python bench/plan_digest.py``): a refactor's proof that it changed
no decision.

It hashes, per input set, every plan of every rollout phase as MessagePack: the property tests' inputs (drawn
from their own strategies, derandomized, so the same on every run of the same strategies) and the policy
benchmark's fleets. Run the same version of this file on the code before and after a change (copy it into
the old checkout): equal lines mean byte-identical plans. Hypothesis derandomizes from the drawing function's
source, so an edit of this file draws other inputs.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

import msgspec  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bench.policy import CONFIG, NOW_DT, evidence_for, synthetic_instances, synthetic_objects  # noqa: E402
from reaper.model import Evidence, Phase  # noqa: E402
from reaper.policy import evaluate  # noqa: E402
from tests.unit import test_properties as props  # noqa: E402


def _property_digest(examples: int) -> str:
    """Plans of the property tests' inputs, every phase, in the order hypothesis draws them."""
    digest = hashlib.sha256()

    @settings(
        max_examples=examples, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(st.lists(props.instances(), max_size=30), props.k8s_fleets(), props.writer_health, props.configs)
    def collect(fleet, k8s, writers, config) -> None:
        objects, evidence = k8s
        evidence = msgspec.structs.replace(evidence, writer_health=writers)
        for phase in Phase:
            plan = evaluate([*fleet, *objects], evidence, config, phase, props.NOW_DT)
            digest.update(msgspec.msgpack.encode(plan))

    collect()
    return digest.hexdigest()


def _fleet_digest(instances: int, runs: int) -> str:
    """Plans of the policy benchmark's synthetic fleets, every phase."""
    digest = hashlib.sha256()
    fleet, objects = synthetic_instances(instances, 50), synthetic_objects(runs)
    evidence: Evidence = evidence_for(fleet, objects)
    for phase in Phase:
        digest.update(msgspec.msgpack.encode(evaluate([*fleet, *objects], evidence, CONFIG, phase, NOW_DT)))
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="property inputs drawn (default 2000)")
    parser.add_argument("--instances", type=int, default=50_000, help="benchmark fleet's instances")
    parser.add_argument("--runs", type=int, default=5_000, help="benchmark fleet's Kubernetes runs")
    args = parser.parse_args()
    print(f"property inputs ({args.examples} drawn): {_property_digest(args.examples)}")
    print(f"benchmark fleet ({args.instances} instances, {args.runs} runs): {_fleet_digest(args.instances, args.runs)}")


if __name__ == "__main__":
    main()
