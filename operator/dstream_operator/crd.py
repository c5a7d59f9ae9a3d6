"""The StreamingJob CustomResourceDefinition, generated from the pydantic models.

The job model (`dstream.spec.JobSpec`) and the status model (`status.JobStatus`) are the single
source of truth; this module turns their JSON Schema into the structural OpenAPI v3 subset that
Kubernetes 1.20 accepts, so the API server rejects what `dstream run` would reject (as far as a
schema can say it). Regenerate the committed file with

    python -m dstream_operator.crd > crds/streamingjob.yaml
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from dstream.spec import API_VERSION, KIND, JobSpec
from pydantic import BaseModel

from dstream_operator.status import JobStatus

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "streamingjobs"
SINGULAR = "streamingjob"
SHORT_NAMES = ["sj"]

# Keywords that carry over unchanged from JSON Schema to the Kubernetes OpenAPI subset.
_KEPT = (
    "type",
    "description",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "enum",
    "format",
)


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON Schema node as a structural OpenAPI v3 node.

    `$ref`s are inlined, `X | None` becomes plain optional X, `const` becomes a one-value enum,
    `exclusiveMinimum: n` becomes OpenAPI 3.0's `minimum: n, exclusiveMinimum: true`, free-form
    maps preserve unknown fields, and `additionalProperties: false` is dropped because the API
    server prunes unknown fields anyway. Titles and defaults stay in the model, where the driver
    and operator apply them; the default is mentioned in the description for `kubectl explain`.
    """
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        return structural({**target, **{k: v for k, v in schema.items() if k != "$ref"}}, defs)
    if "anyOf" in schema:
        return _optional(schema, defs)
    node = {key: schema[key] for key in _KEPT if key in schema}
    if "const" in schema:
        node["enum"] = [schema["const"]]
    if "exclusiveMinimum" in schema:
        node["minimum"] = schema["exclusiveMinimum"]
        node["exclusiveMinimum"] = True
    if "default" in schema and schema["default"] is not None:
        node["description"] = _with_default(node.get("description"), schema["default"])
    if node.get("type") == "object":
        node.update(_object_members(schema, defs))
    if node.get("type") == "array":
        node["items"] = structural(schema["items"], defs)
    return node


def _optional(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    choices = [c for c in schema["anyOf"] if c.get("type") != "null"]
    if len(choices) != 1:
        raise ValueError(f"only `X | None` unions map to a structural schema: {schema}")
    outer = {k: v for k, v in schema.items() if k != "anyOf"}
    return structural({**choices[0], **outer}, defs)


def _object_members(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    members: dict[str, Any] = {}
    if "properties" in schema:
        members["properties"] = {
            name: structural(prop, defs) for name, prop in schema["properties"].items()
        }
        if schema.get("required"):
            members["required"] = list(schema["required"])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and extra:
        members["additionalProperties"] = structural(extra, defs)
    elif "properties" not in schema:
        members["x-kubernetes-preserve-unknown-fields"] = True
    return members


def _with_default(description: str | None, default: Any) -> str:
    shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
    text = f"Default: {shown}."
    return f"{description.rstrip('.')}. {text}" if description else text


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural schema of a pydantic model, with its manifest (camelCase) field names."""
    schema = model.model_json_schema(by_alias=True)
    return structural(schema, schema.get("$defs", {}))


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {
            "name": "Batch",
            "type": "string",
            "jsonPath": ".spec.batchInterval",
            "description": "Batch interval",
        },
        {"name": "Last Batch", "type": "date", "jsonPath": ".status.lastBatchTime"},
        {
            "name": "Rate",
            "type": "number",
            "jsonPath": ".status.rateLimit",
            "description": "Records per second the next batch may admit",
        },
        {
            "name": "Lag",
            "type": "integer",
            "jsonPath": ".status.lagRecords",
            "description": "Records offered by the sources and not yet admitted",
        },
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def custom_resource_definition() -> dict[str, Any]:
    """The whole CRD object; metadata is left to the API server's own validation."""
    spec_schema = model_schema(JobSpec)
    spec_schema["description"] = "What the job computes and how it runs (see dstream.spec)."
    status_schema = model_schema(JobStatus)
    status_schema["description"] = "Observed by the dstream operator; read-only for users."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A D-Stream job: a PySpark driver and its executors.",
                            "required": ["spec"],
                            "properties": {"spec": spec_schema, "status": status_schema},
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    """The CRD as the YAML document committed in crds/streamingjob.yaml."""
    header = "# Generated by `python -m dstream_operator.crd` from dstream.spec; do not edit.\n"
    return header + yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=100)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
