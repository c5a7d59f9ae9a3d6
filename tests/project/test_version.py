"""One version, one image tag, everywhere: the image is dstream:<the project's version>, which is
the chart's appVersion, the image the chart runs the operator from and passes on to the jobs
that name none, and the tag every build command builds (the README's, the chart README's, the
Dockerfile's, e2e/image/build.sh's through tag.sh). A place that drifts fails here."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import tomllib
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from dstream.spec import JobSpec, load_job
from dstream_operator.resources import OWN_IMAGE

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"dstream:{VERSION}"
# Every command that builds or loads the image, in the files people copy them from.
BUILD_COMMANDS = re.compile(r"(?:docker build -t|kind load docker-image) (\S+)")
BUILD_DOCS = ["README.md", "helm/dstream/README.md", "Dockerfile"]


def test_the_installed_package_is_this_version():
    assert importlib.metadata.version("dstream") == VERSION


def test_the_charts_app_version_is_the_projects():
    chart = yaml.safe_load((ROOT / "helm" / "dstream" / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    values = yaml.safe_load((ROOT / "helm" / "dstream" / "values.yaml").read_text())
    assert values["image"] == values["image"] | {"repository": "dstream", "tag": ""}


def test_the_chart_runs_the_operator_from_that_image_and_passes_it_on():
    with helm.Chart.load(ROOT / "helm" / "dstream") as chart:
        rendered = chart.render({}, name="dstream", namespace="dstream-system")
    (deployment,) = [
        doc
        for name, text in rendered.items()
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc and doc["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE
    assert f"--image={IMAGE}" in container["args"]


def test_a_job_without_an_image_runs_the_operators_own():
    assert JobSpec.model_fields["image"].default is None
    assert OWN_IMAGE == IMAGE  # the operator's --image default, without the chart


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_no_example_pins_another_image(name):
    assert load_job(ROOT / "examples" / name).spec.image in (None, IMAGE)


@pytest.mark.parametrize("doc", BUILD_DOCS)
def test_every_build_command_builds_that_tag(doc):
    tags = BUILD_COMMANDS.findall((ROOT / doc).read_text())
    assert tags and set(tags) == {IMAGE}, f"{doc}: {tags}"


def test_the_offline_build_tags_it_so():
    tag = subprocess.run(
        ["bash", str(ROOT / "e2e" / "image" / "tag.sh")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert tag == IMAGE
    build = (ROOT / "e2e" / "image" / "build.sh").read_text()
    assert re.search(r'^IMAGE_REF="\$\(bash "\$\{ROOT\}/e2e/image/tag.sh"\)"$', build, re.M)
