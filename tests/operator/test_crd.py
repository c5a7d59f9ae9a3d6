"""The committed CRD is the one generated from the model, and it accepts what the model accepts."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from dstream.spec import load_job
from dstream_operator import crd
from dstream_operator.status import Condition, Executors, JobStatus

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def openapi_schema() -> dict[str, Any]:
    return crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def validator(part: str) -> jsonschema.Draft4Validator:
    """OpenAPI 3.0 schemas share draft 4's boolean exclusiveMinimum; x-kubernetes-* are ignored."""
    return jsonschema.Draft4Validator(openapi_schema()["properties"][part])


def example_jobs() -> list[tuple[str, dict[str, Any]]]:
    jobs = []
    for path in EXAMPLES:
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == "StreamingJob":
                jobs.append((path.name, document))
    return jobs


def nodes(schema: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        found.append(schema)
        for value in schema.values():
            found.extend(nodes(value))
    elif isinstance(schema, list):
        for value in schema:
            found.extend(nodes(value))
    return found


def test_committed_crd_is_the_generated_one():
    assert (ROOT / "crds" / "streamingjob.yaml").read_text() == crd.render()


def test_schema_is_structural():
    for node in nodes(openapi_schema()):
        assert not {"$ref", "$defs", "anyOf", "oneOf", "allOf", "const", "title"} & set(node)
        assert node.get("additionalProperties") is not False
        if "properties" in node:
            assert node["type"] == "object"


def test_free_form_maps_are_typed_or_preserved():
    spec = openapi_schema()["properties"]["spec"]["properties"]
    assert spec["app"]["properties"]["args"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["sparkConf"]["additionalProperties"] == {"type": "string"}


def test_constraints_come_from_the_model():
    spec = openapi_schema()["properties"]["spec"]
    props = spec["properties"]
    assert set(spec["required"]) == {"batchInterval", "app", "source"}
    assert props["batchInterval"]["pattern"] == r"^[1-9][0-9]*(ms|s|m|h)$"
    assert props["executor"]["properties"]["instances"]["minimum"] == 1
    assert props["restartPolicy"]["properties"]["type"]["enum"] == ["Always", "OnFailure", "Never"]
    quantile = props["speculation"]["properties"]["quantile"]
    assert (quantile["minimum"], quantile["exclusiveMinimum"], quantile["maximum"]) == (0, True, 1)


def test_crd_names_and_subresources():
    spec = crd.custom_resource_definition()["spec"]
    assert spec["group"] == "dstream.dev"
    assert spec["names"]["kind"] == "StreamingJob"
    assert spec["names"]["plural"] == "streamingjobs"
    assert spec["names"]["shortNames"] == ["sj"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Phase", "Batch", "Last Batch", "Rate", "Lag", "Restarts", "Age"]


def test_printer_columns_point_at_schema_fields():
    schema = openapi_schema()
    for column in crd.custom_resource_definition()["spec"]["versions"][0][
        "additionalPrinterColumns"
    ]:
        part, field = column["jsonPath"].strip(".").split(".")
        if part != "metadata":
            assert field in schema["properties"][part]["properties"], column


def test_status_phases():
    phase = openapi_schema()["properties"]["status"]["properties"]["phase"]
    assert phase["enum"] == ["Pending", "Starting", "Running", "Recovering", "Suspended", "Failed"]


@pytest.mark.parametrize(("source", "job"), example_jobs(), ids=lambda v: str(v)[:30])
def test_every_example_is_accepted_by_crd_and_model(source, job):
    validator("spec").validate(job["spec"])
    assert load_job(ROOT / "examples" / source).metadata.name == job["metadata"]["name"]


def test_there_are_examples():
    assert {name for name, _ in example_jobs()} >= {"wordcount.yaml", "kafka-wordcount.yaml"}


BAD_SPECS = [
    (lambda s: s.update(batchInterval="1 sec"), "batchInterval"),
    (lambda s: s["executor"].update(instances=0), "instances"),
    (lambda s: s["source"].update(type="kinesis"), "type"),
    (lambda s: s.pop("app"), "app"),
    (lambda s: s.update(sparkConf={"spark.x": 5}), "spark.x"),
    (lambda s: s["driver"].update(memory="1GB"), "memory"),
    (lambda s: s.update(restartPolicy={"type": "Sometimes"}), "type"),
    (lambda s: s.update(volumes=[{"name": "v", "mountPath": "data"}]), "mountPath"),
    (lambda s: s["speculation"].update(quantile=0), "quantile"),
]


@pytest.mark.parametrize(("mutate", "field"), BAD_SPECS)
def test_bad_specs_are_rejected_naming_the_field(mutate, field):
    spec = copy.deepcopy(yaml.safe_load((ROOT / "examples" / "wordcount.yaml").read_text())["spec"])
    mutate(spec)
    errors = list(validator("spec").iter_errors(spec))
    assert errors
    named = [".".join(map(str, e.absolute_path)) + " " + e.message for e in errors]
    assert any(field in text for text in named), named


def test_a_full_status_fits_the_status_schema():
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    status = JobStatus(
        phase="Running",
        conditions=[Condition(type="DriverReady", status="True", last_transition_time=now)],
        observed_generation=3,
        driver_pod="wc-driver",
        executors=Executors(ready=2, desired=2),
        restarts=1,
        next_restart_time=None,
        last_transition_time=now,
        message="ok",
        last_batch_time=now,
        processing_delay_seconds=0.4,
        scheduling_delay_seconds=0.0,
        total_delay_seconds=0.4,
        rate_limit=2000.0,
        lag_records=350,
    )
    stored = {key: value for key, value in status.to_patch().items() if value is not None}
    validator("status").validate(stored | {"observedGeneration": 3})
    assert not list(validator("status").iter_errors({"phase": "Sleeping"})) == []


def test_operator_uses_only_the_spec_from_the_engine():
    package = ROOT / "operator" / "dstream_operator"
    for module in package.glob("*.py"):
        for line in module.read_text().splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and words[1].split(".")[0] == "dstream":
                assert words[1] == "dstream.spec", f"{module.name}: {line}"
