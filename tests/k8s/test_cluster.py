"""The local control plane (e2e/cluster/local.sh) does what the operator's tests rely on."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from conditions import eventually
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.k8s

WAIT_SECONDS = 60


@pytest.fixture
def namespace(k8s_cluster):
    with k8s_cluster.namespace("dstream-test") as name:
        yield name


def test_api_server_is_kubernetes_1_20(k8s_cluster):
    info = client.VersionApi(k8s_cluster.api_client).get_code()
    assert (info.major, info.minor) == ("1", "20")
    assert info.git_version == "v1.20.2"


def test_namespace_can_be_created_and_read(k8s_cluster, namespace):
    got = k8s_cluster.core.read_namespace(namespace)
    assert got.metadata.name == namespace
    assert got.status.phase == "Active"


def test_pod_is_scheduled_on_hollow_node_and_runs(k8s_cluster, namespace):
    core = k8s_cluster.core
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="sleeper"),
        spec=client.V1PodSpec(
            containers=[
                # The hollow node never pulls or runs anything; the image name is never resolved.
                client.V1Container(name="main", image="dstream.invalid/sleeper:never-pulled")
            ]
        ),
    )
    core.create_namespaced_pod(namespace, pod)

    last = None
    stream = watch.Watch().stream(
        core.list_namespaced_pod,
        namespace,
        field_selector="metadata.name=sleeper",
        timeout_seconds=WAIT_SECONDS,
    )
    for event in stream:
        last = event["object"]
        if last.status.phase == "Running":
            break
    else:
        phase = last.status.phase if last else None
        pytest.fail(f"pod not Running within {WAIT_SECONDS}s (last phase: {phase})")

    assert last.spec.node_name == k8s_cluster.node_name
    assert last.status.container_statuses[0].ready is True


CRD_GROUP = "test.dstream.io"


def _crd(suffix: str) -> client.V1CustomResourceDefinition:
    """A CRD named uniquely per test run, so reruns against a long-lived cluster do not clash."""
    plural, singular, kind = f"streams{suffix}", f"stream{suffix}", f"Stream{suffix.upper()}"
    schema = client.V1JSONSchemaProps(
        type="object",
        properties={
            "spec": client.V1JSONSchemaProps(
                type="object",
                required=["batchIntervalSeconds"],
                properties={
                    "batchIntervalSeconds": client.V1JSONSchemaProps(type="integer", minimum=1),
                    "source": client.V1JSONSchemaProps(type="string", enum=["socket", "kafka"]),
                },
            )
        },
    )
    return client.V1CustomResourceDefinition(
        metadata=client.V1ObjectMeta(name=f"{plural}.{CRD_GROUP}"),
        spec=client.V1CustomResourceDefinitionSpec(
            group=CRD_GROUP,
            scope="Namespaced",
            names=client.V1CustomResourceDefinitionNames(
                plural=plural, singular=singular, kind=kind
            ),
            versions=[
                client.V1CustomResourceDefinitionVersion(
                    name="v1",
                    served=True,
                    storage=True,
                    schema=client.V1CustomResourceValidation(open_apiv3_schema=schema),
                )
            ],
        ),
    )


def _wait_established(ext: client.ApiextensionsV1Api, name: str) -> None:
    stream = watch.Watch().stream(
        ext.list_custom_resource_definition,
        field_selector=f"metadata.name={name}",
        timeout_seconds=WAIT_SECONDS,
    )
    for event in stream:
        conditions = event["object"].status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
    pytest.fail(f"CRD {name} not Established within {WAIT_SECONDS}s")


def _create_when_served(custom, namespace, plural, body):
    """Established precedes the new resource showing up in the API's handlers by a moment:
    retry a 404 until a deadline."""

    def created() -> Any:
        try:
            return custom.create_namespaced_custom_object(CRD_GROUP, "v1", namespace, plural, body)
        except ApiException as e:
            if e.status != 404:
                raise
            return None

    return eventually(created, WAIT_SECONDS, interval=0.5, message=f"{plural} served")


def test_crd_with_structural_schema_is_served_and_validates(k8s_cluster, namespace):
    ext = client.ApiextensionsV1Api(k8s_cluster.api_client)
    custom = client.CustomObjectsApi(k8s_cluster.api_client)
    crd = ext.create_custom_resource_definition(_crd(uuid.uuid4().hex[:6]))
    try:
        _wait_established(ext, crd.metadata.name)
        plural, kind = crd.spec.names.plural, crd.spec.names.kind

        def obj(name, spec):
            return {
                "apiVersion": f"{CRD_GROUP}/v1",
                "kind": kind,
                "metadata": {"name": name},
                "spec": spec,
            }

        created = _create_when_served(
            custom, namespace, plural, obj("good", {"batchIntervalSeconds": 2, "source": "socket"})
        )
        assert created["spec"]["batchIntervalSeconds"] == 2

        with pytest.raises(ApiException) as bad_type:
            custom.create_namespaced_custom_object(
                CRD_GROUP, "v1", namespace, plural, obj("bad-type", {"batchIntervalSeconds": "two"})
            )
        assert bad_type.value.status == 422
        assert "spec.batchIntervalSeconds" in bad_type.value.body

        with pytest.raises(ApiException) as bad_enum:
            custom.create_namespaced_custom_object(
                CRD_GROUP,
                "v1",
                namespace,
                plural,
                obj("bad-enum", {"batchIntervalSeconds": 1, "source": "carrier-pigeon"}),
            )
        assert bad_enum.value.status == 422
        assert "spec.source" in bad_enum.value.body

        listed = custom.list_namespaced_custom_object(CRD_GROUP, "v1", namespace, plural)
        assert [o["metadata"]["name"] for o in listed["items"]] == ["good"]
    finally:
        ext.delete_custom_resource_definition(crd.metadata.name)
