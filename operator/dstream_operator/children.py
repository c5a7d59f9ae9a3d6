"""Which of a job's children to write: those whose desired form changed since the operator last
applied them, as a pure function of the desired objects and what was applied.

A spec change touches one or two children (the ConfigMap, the executors' budget); writing all of
them again costs two round trips each for nothing (a create answered 409, then a patch). The
operator remembers a fingerprint of each child it applied; after a restart it remembers
nothing, so it applies every child once, as it always did.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# What `Kube.delete` takes: apiVersion, kind, namespace, name.
ChildKey = tuple[str, str, str, str]


def child_key(obj: dict[str, Any]) -> ChildKey:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])


def fingerprint(obj: dict[str, Any]) -> str:
    """Of the whole desired object: labels and ownerReferences count as much as the spec."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ChildChanges:
    apply: list[dict[str, Any]]  # new, or different from what was applied
    delete: list[ChildKey]  # applied before, no longer wanted (a budget turned off)

    def record(self, applied: dict[ChildKey, str]) -> None:
        """Remember these changes as done."""
        applied.update({child_key(obj): fingerprint(obj) for obj in self.apply})
        for key in self.delete:
            applied.pop(key, None)


def changes(desired: list[dict[str, Any]], applied: Mapping[ChildKey, str]) -> ChildChanges:
    """What to write so that the live children are `desired`, given what was `applied`."""
    wanted = {child_key(obj): obj for obj in desired}
    return ChildChanges(
        apply=[obj for key, obj in wanted.items() if applied.get(key) != fingerprint(obj)],
        delete=[key for key in applied if key not in wanted],
    )
