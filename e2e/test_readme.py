"""The README's "Run on Kubernetes" section, run command by command on the offline cluster with a
real node, through to `curl .../metrics` answering: the README cannot drift from what works.

The block is the fenced one after the README's `<!-- e2e/test_readme.py ... -->` comment; each of
its lines is one command, its trailing `# ...` the reader's. Each runs as written (bash, from the
repository's root, kubectl 1.20 and Helm on PATH) but for the substitutions below, each of which
must apply: the image's build and load (Docker, kind) become the offline build and the load into
the node's containerd, and the local port of the port-forward, which `curl` reads, becomes a
free one (8000 may be taken on this machine). A command ending in `&` runs in the background
until the end, ready once it has printed a line.

It runs in `make e2e` (e2e/offline.sh), not in `make test`: it needs a node that runs pods
(`e2e/cluster/local.sh up --real-node`), and `make test`'s Kubernetes tests run the hollow node,
which cannot be up beside it. Run alone, it starts the real node and takes it down after. The
cluster has no storage provisioner, so the test gives the claim of examples/cluster/checkpoints.yaml
a hostPath PersistentVolume, as kind's provisioner would; and Helm comes from e2e/cluster/helm.sh.
What the block made is deleted after, so the chaos suite that follows starts from a clean cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.k8s, pytest.mark.image, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
LOCAL_SH = ROOT / "e2e" / "cluster" / "local.sh"
MARKER = "<!-- e2e/test_readme.py"
NAMESPACE = "default"  # where the block's `kubectl apply` puts the job and its claim
CLAIM = yaml.safe_load((ROOT / "examples" / "cluster" / "checkpoints.yaml").read_text())
JOB = "wordcount"
COMMAND_TIMEOUT = 1200  # the longest: an image build that misses its cache
BACKGROUND_READY_TIMEOUT = 60
UP_TIMEOUT = 3600

# (pattern, replacement) on each command; $WORK, $PORT and $CONTAINERD_ADDRESS are set for it.
SUBSTITUTIONS = [
    (
        r"^docker build -t (?P<image>\S+) \.$",
        r'bash e2e/image/build.sh > "$WORK/image-tarball"',
    ),
    (
        r"^kind load docker-image (?P<image>\S+)$",
        r'bash e2e/image/load.sh "$CONTAINERD_ADDRESS" "$(cat "$WORK/image-tarball")"'
        r" | grep -xF docker.io/library/\g<image>",
    ),
    (r"^(?P<forward>kubectl port-forward \S+) 8000 &$", r"\g<forward> $PORT:8000 &"),
    (r"localhost:8000/", "localhost:$PORT/"),
]


def readme_block() -> list[str]:
    """The commands of the marked block, without their comments."""
    text = (ROOT / "README.md").read_text()
    assert text.count(MARKER) == 1, f"README.md: one {MARKER} ... --> comment expected"
    after = text[text.index(MARKER) :].split("\n", 1)[1]
    match = re.match(r"```sh\n(.*?)\n```", after, re.S)
    assert match, "README.md: the marked comment must be followed by a ```sh block"
    return [re.sub(r"\s+# .*$", "", line).strip() for line in match.group(1).splitlines()]


def substituted(commands: list[str]) -> list[str]:
    """The commands as the test runs them; each substitution must apply to one command."""
    for pattern, _ in SUBSTITUTIONS:
        hits = sum(1 for command in commands if re.search(pattern, command))
        assert hits == 1, f"{pattern!r} applies to {hits} README commands, not 1: {commands}"
    result = []
    for command in commands:
        for pattern, replacement in SUBSTITUTIONS:
            command = re.sub(pattern, replacement, command)
        result.append(command)
    return result


def _script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(LOCAL_SH), *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def cluster_env() -> Iterator[dict[str, str]]:
    """The environment the commands run in: the real node's cluster (started here if it is not
    up; refused if a hollow one is), its kubectl and Helm first on PATH."""
    already_up = _script("status", timeout=60).returncode == 0
    up = _script("up", "--real-node", timeout=UP_TIMEOUT)
    if up.returncode != 0:
        pytest.fail(f"local.sh up --real-node failed:\n{up.stdout}{up.stderr}", pytrace=False)
    try:
        exports = _script("env", timeout=60).stdout
        variables = dict(re.findall(r"^export (\w+)=(.*)$", exports, re.M))
        path = variables["PATH"].replace("$PATH", os.environ["PATH"])
        helm = subprocess.run(
            ["bash", str(ROOT / "e2e" / "cluster" / "helm.sh")],
            capture_output=True,
            text=True,
            check=True,
            timeout=COMMAND_TIMEOUT,
        ).stdout.strip()
        yield os.environ | variables | {"PATH": f"{Path(helm).parent}:{path}"}
    finally:
        if not already_up:
            _script("down", timeout=300)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(command: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _say(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


@contextlib.contextmanager
def claim_volume(env: dict[str, str]) -> Iterator[None]:
    """A hostPath PersistentVolume for the examples' claim, in a directory the image's user may
    write (a hostPath gets no fsGroup), removed after with what the job wrote there."""
    directory = Path(tempfile.mkdtemp(prefix="dstream-readme-"))
    directory.chmod(0o777)
    name = f"readme-{CLAIM['metadata']['name']}"
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "accessModes": CLAIM["spec"]["accessModes"],
            "capacity": CLAIM["spec"]["resources"]["requests"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": str(directory)},
            "claimRef": {"namespace": NAMESPACE, "name": CLAIM["metadata"]["name"]},
        },
    }
    (directory.parent / f"{name}.yaml").write_text(yaml.safe_dump(volume))
    created = _run(f"kubectl apply -f {directory.parent / f'{name}.yaml'}", env)
    assert created.returncode == 0, created.stderr
    try:
        yield
    finally:
        _run(f"kubectl delete pv {name} --ignore-not-found --wait=false", env)
        (directory.parent / f"{name}.yaml").unlink()
        shutil.rmtree(directory, ignore_errors=True)


def clean_up(env: dict[str, str]) -> None:
    """Delete what the block made: the job (its pods go with it), the operator, the claim."""
    for command in (
        f"kubectl delete -n {NAMESPACE} -f examples/{JOB}.yaml --ignore-not-found --wait",
        f"kubectl wait -n {NAMESPACE} --for=delete pod -l dstream.dev/job={JOB} --timeout=300s",
        "helm uninstall dstream -n dstream-system --wait",
        "kubectl delete namespace dstream-system --ignore-not-found --wait",
        f"kubectl delete -n {NAMESPACE} -f examples/cluster/checkpoints.yaml --ignore-not-found",
    ):
        done = _run(command, env, timeout=600)
        _say(f"cleanup: {command}: exit {done.returncode} {done.stderr.strip()}")


def diagnostics(env: dict[str, str]) -> str:
    commands = (
        "kubectl get pods -A -o wide",
        f"kubectl describe sj -n {NAMESPACE} {JOB}",
        "kubectl logs -n dstream-system -l app.kubernetes.io/name=dstream --tail=40 --prefix",
        f"kubectl logs -n {NAMESPACE} -l dstream.dev/job={JOB} --tail=60 --prefix",
    )
    return "\n".join(f"$ {c}\n{_run(c, env).stdout}" for c in commands)


@pytest.mark.timeout(3600)
def test_the_readme_kubernetes_section_runs_as_written(cluster_env, tmp_path):
    commands = substituted(readme_block())
    env = cluster_env | {"WORK": str(tmp_path), "PORT": str(_free_port())}
    background: list[subprocess.Popen] = []
    try:
        with claim_volume(env):
            try:
                last = run_all(commands, env, background)
                # the last command: the job's metrics, through a port-forward to its Service
                metric = rf'^dstream_batches_completed_total{{job="{JOB}"}} [1-9]'
                assert re.search(metric, last, re.M), last
                assert checkpoint_shared(env) == "True", diagnostics(env)
            finally:
                clean_up(env)
    finally:
        for process in background:
            process.terminate()
            process.wait(timeout=30)


def run_all(commands: list[str], env: dict[str, str], background: list[subprocess.Popen]) -> str:
    """Run the commands in order, failing at the first that fails; the last one's output."""
    output = ""
    for command in commands:
        _say(f"README: {command}")
        if command.endswith("&"):
            background.append(start_in_background(command[:-1].strip(), env))
            continue
        done = _run(command, env, timeout=COMMAND_TIMEOUT)
        output = done.stdout
        _say(done.stdout[-3000:] + done.stderr[-2000:])
        assert done.returncode == 0, (
            f"`{command}` exited {done.returncode}:\n{done.stdout}{done.stderr}\n"
            + diagnostics(env)
        )
    return output


def checkpoint_shared(env: dict[str, str]) -> str:
    """The job's CheckpointShared condition: the example's checkpoint is on the claim."""
    path = '{.status.conditions[?(@.type=="CheckpointShared")].status}'
    return _run(f"kubectl get sj -n {NAMESPACE} {JOB} -o jsonpath='{path}'", env).stdout


def start_in_background(command: str, env: dict[str, str]) -> subprocess.Popen:
    """Start `command` (exec'd, so its pid is its own) and wait for its first line of output
    (kubectl port-forward prints "Forwarding from ..." once it listens)."""
    process = subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], BACKGROUND_READY_TIMEOUT)
    first = process.stdout.readline() if ready else ""
    _say(f"README (background, pid {process.pid}): {first.strip()}")
    if not first or process.poll() is not None:
        process.kill()
        rest = process.communicate()[0]
        pytest.fail(
            f"`{command}` printed nothing within {BACKGROUND_READY_TIMEOUT}s or ended: "
            f"{first}{rest}\n{diagnostics(env)}"
        )
    return process
