"""GCE projects by their canonical id (docs/design.md §4): the other names a swept project answers to.

Every project of a sweep is keyed by its id. ``gce.protected_projects`` and writer-health labels
may name a project by its number instead; the sweep's resolution (``Evidence.resolved``) says
which numbers each project is known by. Where a project's number is not known (``projects.get``
was not allowed, an offline export), a number that names no known project may be that project's:
it is read as the project's too (unknown means keep).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping

from reaper.model import Resolved, WriterRecord, is_project_number


class ProjectNames:
    """The names the swept projects answer to, built once per sweep from its resolution."""

    def __init__(self, resolved: Mapping[str, Resolved]) -> None:
        # Numbers of resolved projects only: an unresolved name proves nothing about any project.
        self.known = {n: r.scope for r in resolved.values() if not r.problem for n in r.numbers}
        self.numbered = frozenset(self.known.values())  # the projects whose number is known

    def canonical(self, name: str) -> str:
        """The project ``name`` names: the id whose number it is, else ``name`` itself."""
        return self.known.get(name, name)

    def may_be(self, name: str, project: str) -> bool:
        """Whether ``name`` (an id or a number) names, or may name, ``project`` (an id)."""
        if self.canonical(name) == project:
            return True
        return project not in self.numbered and is_project_number(name) and name not in self.known

    def protected_by(self, project: str, protected: Collection[str]) -> str | None:
        """The entry of ``gce.protected_projects`` that protects ``project``, or None.

        Its id or a number it is known by protects it; so does a number known as no project's while
        this project's own number is unknown.
        """
        return next((entry for entry in protected if self.may_be(entry, project)), None)

    def writers(self, records: list[WriterRecord], projects: Iterable[str]) -> dict[str, list[WriterRecord]]:
        """Writer-health records by project id (``projects``: the sweep's).

        A record labelled by a known number is its project's. One labelled by a number known as no
        project's may be the writer of any project whose number is unknown: each of those gets it
        as a record of unknown health (its last pass NaN), so its writer health is unknown.
        """
        grouped: dict[str, list[WriterRecord]] = defaultdict(list)
        for record in records:
            grouped[self.canonical(record.project)].append(record)
        strays = [r for r in records if is_project_number(r.project) and r.project not in self.known]
        if strays:
            for project in set(projects) - self.numbered:
                grouped[project] += [WriterRecord(r.manager, project, math.nan, r.failing) for r in strays]
        return grouped

    def reporting(self, pairs: frozenset[tuple[str, str]] | None) -> frozenset[tuple[str, str]] | None:
        """Writer-health (manager, project) pairs with each project label read as the project's id."""
        return None if pairs is None else frozenset((manager, self.canonical(p)) for manager, p in pairs)
