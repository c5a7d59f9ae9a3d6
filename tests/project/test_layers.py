"""The package layers hold (docs/architecture.md): no package imports a layer above it, and the
light entry points stay light. Each import check runs a fresh interpreter, because this test
process has long since loaded PySpark."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path

from dstream import spec
from dstream.connectors import SINKS, SOURCES, factory

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pyspark", "py4j", "redis", "nats", "psycopg")


def modules_loaded_by(code: str) -> set[str]:
    """The top-level packages in sys.modules after a fresh interpreter runs `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_the_operator_and_the_job_spec_load_no_pyspark() -> None:
    code = (
        "import pkgutil, importlib, dstream.spec, dstream_operator\n"
        "for m in pkgutil.iter_modules(dstream_operator.__path__):\n"
        "    importlib.import_module('dstream_operator.' + m.name)\n"
    )
    loaded = modules_loaded_by(code)
    assert "dstream_operator" in loaded
    assert loaded.isdisjoint(HEAVY), sorted(loaded.intersection(HEAVY))


def test_import_dstream_loads_no_pyspark_nor_pydantic() -> None:
    loaded = modules_loaded_by("import dstream")
    assert loaded.isdisjoint({*HEAVY, "pydantic"}), sorted(loaded.intersection(HEAVY))


def test_the_public_names_load_on_first_use() -> None:
    loaded = modules_loaded_by("from dstream import StreamingContext")
    assert "pyspark" in loaded
    assert loaded.isdisjoint({"redis", "nats", "psycopg"})


def test_the_layers_contract_holds() -> None:
    """pyproject.toml's [tool.importlinter] contracts (also run by `make lint`)."""
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_spec_type_names_a_connector_factory() -> None:
    source_types = typing.get_args(spec.Source.model_fields["type"].annotation)
    sink_types = typing.get_args(spec.Sink.model_fields["type"].annotation)
    assert set(SOURCES) == set(source_types)
    assert set(SINKS) == set(sink_types)
    for table in (SOURCES, SINKS):
        for type_ in table:
            assert callable(factory(table, type_)), type_
