"""Which children a change writes (`dstream_operator.children`): only those that changed."""

from __future__ import annotations

from dstream.spec import parse_job
from dstream_operator import children, resources

OWNER = resources.Owner("wc", "jobs", "uid-1")


def desired(**spec) -> list[dict]:
    document = {
        "apiVersion": "dstream.dev/v1alpha1",
        "kind": "StreamingJob",
        "metadata": {"name": "wc", "namespace": "jobs"},
        "spec": {
            "batchInterval": "1s",
            "app": {"builtin": "wordcount"},
            "source": {"type": "rate", "rate": {"recordsPerSecond": 10}},
            "executor": {"instances": 2},
        }
        | spec,
    }
    return resources.children(parse_job(document, "test"), OWNER, resources.Platform())


def applied_after(objects: list[dict]) -> dict:
    applied: dict = {}
    children.changes(objects, {}).record(applied)
    return applied


def kinds(objects: list[dict]) -> list[str]:
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)


def test_nothing_applied_yet_applies_everything():
    todo = children.changes(desired(), {})
    assert kinds(todo.apply) == kinds(desired()) and not todo.delete


def test_an_unchanged_spec_writes_nothing():
    todo = children.changes(desired(), applied_after(desired()))
    assert todo.apply == [] and todo.delete == []


def test_more_executors_write_the_config_map_and_the_executors_budget_only():
    todo = children.changes(desired(executor={"instances": 3}), applied_after(desired()))
    assert kinds(todo.apply) == ["ConfigMap/wc-job", "PodDisruptionBudget/wc-executor"]
    assert todo.delete == []


def test_a_budget_turned_off_is_deleted_and_then_forgotten():
    off = desired(executor={"instances": 2, "disruptionBudget": {"enabled": False}})
    applied = applied_after(desired())
    todo = children.changes(off, applied)
    assert todo.delete == [("policy/v1", "PodDisruptionBudget", "jobs", "wc-executor")]
    todo.record(applied)
    assert children.changes(off, applied).delete == []


def test_a_users_account_adds_its_binding_and_dropping_it_deletes_it():
    own = desired(driver={"serviceAccountName": "analytics"})
    applied = applied_after(desired())
    todo = children.changes(own, applied)
    assert "RoleBinding/wc-driver-account" in kinds(todo.apply)
    todo.record(applied)
    back = children.changes(desired(), applied)
    assert back.delete == [
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "jobs", "wc-driver-account")
    ]


def test_a_new_owner_uid_rewrites_every_child():
    """A job deleted and created again under the same name: its children must name the new uid."""
    applied = applied_after(desired())
    again = [
        obj | {"metadata": obj["metadata"] | {"ownerReferences": [{"uid": "uid-2"}]}}
        for obj in desired()
    ]
    assert kinds(children.changes(again, applied).apply) == kinds(desired())
