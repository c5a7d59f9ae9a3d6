"""Pure status derivation, restart policy and supervision plans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import yaml
from dstream.spec import RestartPolicy, parse_job
from dstream_operator import reconcile, restarts, status
from dstream_operator.main import parse_args
from dstream_operator.resources import spec_hash
from dstream_operator.status import JobStatus, PodFacts
from dstream_operator.supervisor import JobBook, JobMemory

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def pod(phase="Running", ready=False, **meta) -> dict:
    return {
        "metadata": {"name": "wc-driver", "uid": "p1", **meta},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }


def test_pod_facts_read_the_pod_ip():
    body = pod()
    body["status"]["podIP"] = "10.244.0.7"
    assert status.pod_facts(body).ip == "10.244.0.7"
    assert status.pod_facts(pod()).ip is None


def test_pod_facts_of_a_failed_driver():
    body = pod("Failed")
    body["status"]["containerStatuses"] = [
        {"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    ]
    facts = status.pod_facts(body)
    assert facts.terminal and not facts.alive
    assert facts.describe_end() == "driver pod wc-driver failed, reason OOMKilled, exit code 137"


def test_pod_facts_read_operator_annotations():
    facts = status.pod_facts(
        pod(
            annotations={"dstream.dev/stop-reason": "suspend", "dstream.dev/spec-hash": "h"},
            deletionTimestamp="2026-01-01T00:00:00Z",
        )
    )
    assert (facts.stop_reason, facts.spec_hash, facts.deleting) == ("suspend", "h", True)


def test_driver_report_sums_the_lag_of_every_source():
    report = status.driver_report({"state": "running", "backlog": {"a": 1200, "b": 34}})
    assert report.lag_records == 1234
    unknown = status.driver_report({"state": "running", "backlog": {"a": 5, "b": None}})
    assert unknown.lag_records is None
    assert status.driver_report({"state": "running"}).lag_records is None


def test_driver_report_sums_rate_limits():
    report = status.driver_report(
        {
            "state": "running",
            "lastBatch": {
                "time": "2026-01-01T00:00:01+00:00",
                "processingSeconds": 0.5,
                "schedulingDelaySeconds": 0.1,
                "totalDelaySeconds": 0.6,
            },
            "rateLimit": {"a": 100.0, "b": 50.0},
        }
    )
    assert report.rate_limit == 150.0
    assert report.last_batch_time == NOW + timedelta(seconds=1)
    unlimited = status.driver_report({"state": "running", "rateLimit": {"a": 1.0, "b": None}})
    assert unlimited.rate_limit is None and unlimited.last_batch_time is None


def test_running_phase():
    facts = status.pod_facts(pod(ready=True))
    report = status.driver_report({"state": "recovering"})
    assert status.running_phase(facts, 0, None) == "Running"
    assert status.running_phase(facts, 0, report) == "Recovering"
    assert status.running_phase(status.pod_facts(pod()), 0, None) == "Starting"
    assert status.running_phase(status.pod_facts(pod()), 2, None) == "Recovering"
    assert status.running_phase(status.pod_facts({"metadata": {"name": "x"}}), 0, None) == "Pending"


def test_transition_times_move_only_on_change():
    first = status.with_phase(JobStatus(), "Running", None, NOW)
    later = status.with_phase(first, "Running", None, NOW + timedelta(minutes=1))
    assert later.last_transition_time == NOW
    ready = status.pod_facts(pod(ready=True))
    a = status.with_driver(first, ready, 2, 2, None, NOW)
    b = status.with_driver(a, ready, 2, 2, None, NOW + timedelta(minutes=1))
    assert [c.last_transition_time for c in b.conditions] == [NOW, NOW]


def test_the_first_restart_is_immediate_then_backoff_doubles_up_to_the_cap():
    policy = RestartPolicy(backoff_seconds=10, max_backoff_seconds=60)
    assert [restarts.backoff_seconds(policy, n) for n in range(6)] == [0, 10, 20, 40, 60, 60]
    assert restarts.backoff_seconds(policy, 10_000) == 60


def test_restart_decisions():
    failed = restarts.Termination(True, "boom")
    clean = restarts.Termination(False, "exited")
    always = RestartPolicy(type="Always", max_restarts=2, backoff_seconds=5)
    assert restarts.decide(always, 0, clean) == restarts.Restart(0, 1)
    assert restarts.decide(always, 1, failed) == restarts.Restart(5, 2)
    assert "maxRestarts (2) reached" in restarts.decide(always, 2, failed).reason
    on_failure = RestartPolicy(type="OnFailure")
    assert isinstance(restarts.decide(on_failure, 0, failed), restarts.Restart)
    assert isinstance(restarts.decide(on_failure, 0, clean), restarts.GiveUp)
    assert "Never" in restarts.decide(RestartPolicy(type="Never"), 0, failed).reason


def job(**spec):
    base = {
        "batchInterval": "1s",
        "app": {"builtin": "wordcount"},
        "source": {"type": "rate", "rate": {"recordsPerSecond": 10}},
    }
    return parse_job(
        {
            "apiVersion": "dstream.dev/v1alpha1",
            "kind": "StreamingJob",
            "metadata": {"name": "wc"},
            "spec": base | spec,
        }
    )


def seen(spec_job=None, driver=None, vanished=None, current=None, **kw) -> reconcile.Observation:
    spec_job = spec_job or job()
    return reconcile.Observation(
        job=spec_job,
        job_uid="uid-wc",
        problems=(),
        status=current or JobStatus(phase="Running"),
        driver=driver,
        vanished=vanished,
        executors_ready=0,
        report=kw.pop("report", None),
        spec_hash=spec_hash(spec_job),
        now=NOW,
        **kw,
    )


def facts(**kw) -> PodFacts:
    base = status.pod_facts(
        pod(ready=True, annotations={"dstream.dev/spec-hash": spec_hash(job())})
    )
    return base.__class__(**{**base.__dict__, **kw})


def test_plan_creates_a_missing_driver():
    step = reconcile.plan(seen(current=JobStatus()))
    assert step.create_driver and step.status.phase == "Starting"


def test_plan_restarts_a_lost_driver_at_once_the_first_time():
    step = reconcile.plan(seen(driver=facts(phase="Failed")))
    assert step.stop_driver == reconcile.STOP_ENDED and step.restarted
    assert step.status.restarts == 1 and "restart 1/10 now" in step.status.message
    assert step.status.next_restart_time == NOW
    assert not step.create_driver  # without a checkpoint: once the old pod is gone
    assert reconcile.plan(seen(current=step.status)).create_driver


def test_a_lost_drivers_replacement_does_not_wait_for_the_old_pod_with_a_checkpoint():
    """Each attempt's pod has a name of its own, and the checkpoint's epoch fences the old
    driver: the replacement is created in the step that handles the loss, while the old pod
    still stops. A driver stopped on purpose, or one without a checkpoint, is waited for."""
    fenced = job(checkpoint={"path": "/ckpt/wc"})
    step = reconcile.plan(seen(fenced, driver=facts(deleting=True)))
    assert step.restarted and step.stop_driver == reconcile.STOP_ENDED and step.create_driver
    ended = facts(deleting=True, stop_reason=reconcile.STOP_ENDED)
    assert reconcile.plan(seen(fenced, stopping=(ended,), current=step.status)).create_driver
    changed = facts(deleting=True, stop_reason=reconcile.STOP_SPEC_CHANGE)
    assert not reconcile.plan(seen(fenced, stopping=(changed,))).create_driver
    assert not reconcile.plan(seen(stopping=(ended,), current=step.status)).create_driver


def test_plan_restarts_a_failed_driver_after_backoff():
    once = JobStatus(phase="Running", restarts=1)
    step = reconcile.plan(seen(driver=facts(phase="Failed"), current=once))
    assert step.stop_driver == reconcile.STOP_ENDED and step.restarted
    assert step.status.restarts == 2 and step.status.phase == "Recovering"
    assert step.status.next_restart_time == NOW + timedelta(seconds=10)
    waiting = reconcile.plan(seen(current=step.status))
    assert not waiting.create_driver and waiting.status.phase == "Recovering"
    assert waiting.wake_at == step.status.next_restart_time  # not the next poll tick
    later = reconcile.Observation(
        **{**seen(current=step.status).__dict__, "now": NOW + timedelta(seconds=11)}
    )
    assert reconcile.plan(later).create_driver


def test_plan_ignores_a_driver_the_operator_stopped():
    step = reconcile.plan(seen(vanished=facts(stop_reason="spec-change")))
    assert step.create_driver and not step.restarted and step.status.restarts == 0


def test_plan_counts_a_driver_deleted_by_someone_else():
    step = reconcile.plan(seen(vanished=facts()))
    assert step.restarted and "was deleted" in step.status.message


def test_a_gracefully_deleted_driver_is_one_restart():
    """A real kubelet first marks the pod deleting, then ends it (Failed, exit 143), then it
    goes: the loss counts once, when the deletion mark shows, and the pod gets marked."""
    marked = reconcile.plan(seen(driver=facts(deleting=True)))
    assert marked.restarted and marked.status.restarts == 1
    assert marked.stop_driver == reconcile.STOP_ENDED and "was deleted" in marked.status.message
    handled = dict(stop_reason=reconcile.STOP_ENDED, deleting=True)
    for later in (
        seen(current=marked.status, driver=facts(**handled)),
        seen(current=marked.status, driver=facts(phase="Failed", **handled)),
        seen(current=marked.status, vanished=facts(phase="Failed", **handled)),
    ):
        step = reconcile.plan(later)
        assert not step.restarted and step.status.restarts == 1


def test_the_book_keeps_the_supervisors_mark_on_a_driver():
    book = JobBook()
    key = ("jobs", "wc")
    book.see_job(key, {"metadata": {"name": "wc", "namespace": "jobs"}})
    book.see_driver(key, facts(), deleted=False)
    book.jobs[key].mark_stopped(facts(), reconcile.STOP_ENDED)  # as _act does
    book.see_driver(key, facts(phase="Failed"), deleted=False)  # an event from before the mark
    memory = book.jobs[key]
    assert memory.drivers["wc-driver"].stop_reason == reconcile.STOP_ENDED
    book.see_driver(key, facts(name="wc-driver-2", uid="p2"), deleted=False)  # the next one
    view = memory.view("wc")
    assert view.driver.uid == "p2" and view.driver.stop_reason is None and view.second is None
    assert [p.uid for p in view.stopping] == ["p1"]  # the old one, on its way out
    book.see_driver(key, facts(phase="Failed"), deleted=True)
    assert [p.stop_reason for p in memory.vanished] == [reconcile.STOP_ENDED]
    assert memory.view("wc").driver.uid == "p2" and not memory.view("wc").stopping


def test_a_driver_name_the_api_server_already_had_is_forgotten_when_that_pod_goes():
    """A create answered 409 (a pod of that name the operator had not seen, such as an earlier
    job's still being deleted) leaves an entry without a uid; that pod's deletion must remove
    it, or the job would wait for a driver that no longer exists."""
    book = JobBook()
    key = ("jobs", "wc")
    book.see_job(key, {"metadata": {"name": "wc", "namespace": "jobs"}})
    book.jobs[key].drivers["wc-driver-3"] = facts(name="wc-driver-3", uid=None)
    book.see_driver(key, facts(name="wc-driver-3", uid="old", owner_uid="earlier"), deleted=True)
    memory = book.jobs[key]
    assert memory.view("wc").driver is None
    assert [p.uid for p in memory.vanished] == ["old"]


def test_plan_leaves_the_driver_of_an_earlier_job_of_the_same_name_alone():
    """`kubectl delete` then `apply`: the old driver pod, owned by the old uid, is still being
    garbage-collected. Its presence delays the new driver; its end is no restart."""
    earlier = facts(owner_uid="uid-earlier", deleting=True)
    waiting = reconcile.plan(seen(driver=earlier, current=JobStatus()))
    assert not (waiting.create_driver or waiting.stop_driver or waiting.restarted)
    assert waiting.status.phase == "Pending" and "earlier job" in waiting.status.message
    assert waiting.status.driver_pod is None
    gone = reconcile.plan(seen(vanished=earlier, current=JobStatus()))
    assert gone.create_driver and not gone.restarted and gone.status.restarts == 0
    own = reconcile.plan(seen(vanished=facts(owner_uid="uid-wc")))
    assert own.restarted


def test_pod_facts_name_the_controlling_owner():
    body = pod(ownerReferences=[{"uid": "x"}, {"uid": "uid-wc", "controller": True}])
    assert status.pod_facts(body).owner_uid == "uid-wc"
    assert status.pod_facts(pod()).owner_uid is None


def test_plan_restarts_an_outdated_driver_and_suspends():
    step = reconcile.plan(seen(driver=facts(spec_hash="old")))
    assert step.stop_driver == reconcile.STOP_SPEC_CHANGE and not step.restarted
    suspended = reconcile.plan(seen(spec_job=job(suspend=True), driver=facts()))
    assert suspended.stop_driver == reconcile.STOP_SUSPEND
    assert suspended.status.phase == "Suspended" and not suspended.create_driver


def test_plan_for_an_invalid_spec():
    observation = reconcile.Observation(
        **{**seen().__dict__, "job": None, "problems": ("spec.app: bad",)}
    )
    step = reconcile.plan(observation)
    assert step.status.phase == "Failed" and "spec.app: bad" in step.status.message
    assert [e.reason for e in step.events] == ["InvalidSpec"]


def test_a_failed_job_starts_again_with_a_fresh_budget_once_its_spec_changed():
    failed = JobStatus(phase="Failed", restarts=10, observed_generation=1, message="gave up")
    same = reconcile.plan(seen(current=failed, generation=1))
    assert same.status.phase == "Failed" and not same.create_driver and not same.events
    changed = reconcile.plan(seen(current=failed, generation=2))
    assert changed.create_driver and changed.status.restarts == 0
    assert changed.status.phase == "Starting"
    assert [e.reason for e in changed.events] == [
        "Retrying",
        "DriverCreated",
        "CheckpointNotShared",
    ]
    unknown = reconcile.plan(seen(current=failed.model_copy(update={"observed_generation": None})))
    assert unknown.status.phase == "Failed"  # a status of an operator without generations


def test_cli_scope_and_defaults():
    args = parse_args(["--namespace", "a", "-n", "b", "--standalone"])
    assert args.namespace == ["a", "b"] and args.standalone and not args.all_namespaces
    args = parse_args(["--all-namespaces"])
    assert args.peering == "dstream" and args.metrics_port == 8080 and args.driver_host == "service"


def test_supervisor_wakes_when_a_backoff_ends_before_the_next_tick():
    book = JobBook()
    assert book.seconds_to_wait(5.0, NOW) == 5.0
    for name in ("a", "b"):
        book.see_job(("jobs", name), {"metadata": {"name": name}})
    book.step_at(("jobs", "a"), NOW + timedelta(seconds=1.5))
    book.step_at(("jobs", "b"), NOW + timedelta(seconds=30))
    assert book.seconds_to_wait(5.0, NOW) == 1.5
    assert book.seconds_to_wait(5.0, NOW + timedelta(seconds=2)) == 0.0


def test_a_stop_is_remembered_on_a_pod_that_vanished_meanwhile():
    """A force-deleted driver can be gone (a DELETED event) while the supervisor is still
    marking it: the mark lands on the vanished pod, whose end is then not counted twice."""
    ended = facts(phase="Failed")
    memory = JobMemory(vanished=[ended])  # the DELETED event came during the await
    memory.mark_stopped(ended, reconcile.STOP_ENDED)
    assert not memory.drivers and memory.vanished[0].stop_reason == reconcile.STOP_ENDED
    memory = JobMemory(drivers={"wc-driver": facts(uid="p2")})  # a successor of the same name
    memory.mark_stopped(ended, reconcile.STOP_ENDED)
    assert memory.drivers["wc-driver"].stop_reason is None


def test_the_restart_count_resets_after_a_stable_run():
    policy = {"type": "Always", "resetAfterSeconds": 60}
    spec_job = job(restartPolicy=policy)
    ready_since = status.Condition(
        type="DriverReady", status="True", last_transition_time=NOW - timedelta(seconds=59)
    )
    recovered = JobStatus(phase="Running", restarts=3, conditions=[ready_since])
    driver = facts(spec_hash=spec_hash(spec_job))
    early = reconcile.plan(seen(spec_job, driver=driver, current=recovered))
    assert early.status.restarts == 3 and not early.events
    later = reconcile.Observation(
        **{
            **seen(spec_job, driver=driver, current=recovered).__dict__,
            "now": NOW + timedelta(seconds=1),
        }
    )
    step = reconcile.plan(later)
    assert step.status.restarts == 0
    assert [e.reason for e in step.events] == ["RestartCountReset"]
    # a driver that is not ready, or a policy that never resets, keeps the count
    not_ready = recovered.model_copy(
        update={"conditions": [ready_since.model_copy(update={"status": "False"})]}
    )
    assert reconcile.plan(seen(spec_job, driver=driver, current=not_ready)).status.restarts == 3
    never = job(restartPolicy={"resetAfterSeconds": 0})
    assert not restarts.stable_since(never.spec.restart_policy, NOW - timedelta(days=9), NOW)


def test_rollback_needs_a_stable_spec_and_can_be_turned_off():
    changed = job(batchInterval="2s")
    failed = facts(phase="Failed", spec_hash=spec_hash(changed))
    stable_text = yaml.safe_dump(
        job().model_dump(mode="json", by_alias=True, exclude_unset=True)["spec"]
    )
    stable = JobStatus(phase="Running", stable_spec=stable_text, stable_spec_hash="s1")
    for current, spec_job, rolls_back in [
        (JobStatus(phase="Running", upgrade_failures=1), changed, False),  # nothing proven yet
        (stable.model_copy(update={"upgrade_failures": 1}), changed, True),
        (
            stable.model_copy(update={"upgrade_failures": 1}),
            job(batchInterval="2s", upgrade={"rollbackOnFailure": False}),
            False,
        ),
    ]:
        step = reconcile.plan(seen(spec_job, driver=failed, current=current))
        assert (step.status.rolled_back_from is not None) == rolls_back
        assert ("RolledBack" in [e.reason for e in step.events]) == rolls_back


def test_a_committed_batch_makes_the_spec_stable():
    report = status.DriverReport("running", NOW, 0.1, 0.0, 0.1, None, None)
    step = reconcile.plan(seen(driver=facts(), report=report))
    assert step.status.stable_spec_hash == spec_hash(job())
    assert (
        parse_job(
            {
                "apiVersion": "dstream.dev/v1alpha1",
                "kind": "StreamingJob",
                "metadata": {"name": "wc"},
                "spec": yaml.safe_load(step.status.stable_spec),
            }
        ).spec
        == job().spec
    )
    assert reconcile.plan(seen(driver=facts())).status.stable_spec_hash is None  # no batch yet
