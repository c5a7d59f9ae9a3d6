"""Merging a user's pod template under a generated pod, as pure functions on plain dicts.

The generated pod wins: where both set a value and the values differ, the generated one is kept
and the field's path is reported, so the operator can say in a warning Event which template
fields it ignored. Lists of named things (containers, volumes, env, ...) merge entry by entry;
`tolerations`, `envFrom` and the like are joined; lists the operator owns outright (a container's
command, args and ports, the pod's ownerReferences) are replaced.
"""

from __future__ import annotations

from typing import Any

# Lists merged entry by entry, and the key that identifies an entry.
KEYED_LISTS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
}
# Lists the generated side owns whole: a template's own entries would change what runs.
OWNED_LISTS = frozenset({"command", "args", "ports", "ownerReferences"})


def merge_under(template: Any, generated: Any, path: str = "") -> tuple[Any, list[str]]:
    """`generated` laid over `template`; returns the merged value and the paths where the
    template's value was overridden."""
    if isinstance(template, dict) and isinstance(generated, dict):
        return _merge_maps(template, generated, path)
    key = path.rsplit(".", 1)[-1]
    if isinstance(template, list) and isinstance(generated, list) and key not in OWNED_LISTS:
        if key in KEYED_LISTS:
            return _merge_keyed(template, generated, KEYED_LISTS[key], path)
        return template + [item for item in generated if item not in template], []
    return generated, [] if template == generated else [path]


def _merge_maps(
    template: dict[str, Any], generated: dict[str, Any], path: str
) -> tuple[dict[str, Any], list[str]]:
    merged = dict(template)
    overridden: list[str] = []
    for key, value in generated.items():
        if key in template:
            merged[key], lost = merge_under(template[key], value, _join(path, key))
            overridden += lost
        else:
            merged[key] = value
    return merged, overridden


def _merge_keyed(
    template: list[Any], generated: list[Any], key: str, path: str
) -> tuple[list[Any], list[str]]:
    """Generated entries first (Spark and `kubectl logs` take the first container as the
    main one), each merged over the template's entry of the same key; then the template's
    other entries (sidecars, extra volumes) in their order."""
    by_key = {entry.get(key): entry for entry in template if isinstance(entry, dict)}
    merged: list[Any] = []
    overridden: list[str] = []
    for entry in generated:
        ident = entry.get(key)
        if ident in by_key:
            entry, lost = merge_under(by_key.pop(ident), entry, f"{path}[{ident}]")
            overridden += lost
        merged.append(entry)
    taken = {entry.get(key) for entry in generated}
    merged += [e for e in template if not isinstance(e, dict) or e.get(key) not in taken]
    return merged, overridden


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
