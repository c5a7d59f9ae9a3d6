"""The README's Kubernetes block, as e2e/test_readme.py (make e2e) runs it on a real node: found
by its comment, every substitution applying, from the image build to `curl .../metrics`. This
part needs no cluster, so `make test` catches a README edit that the full run would trip on."""

from __future__ import annotations

from e2e.test_readme import readme_block, substituted


def test_the_block_is_found_and_every_substitution_applies():
    written = readme_block()
    commands = substituted(written)
    assert len(commands) == len(written) and all(commands)
    assert commands[0] == 'bash e2e/image/build.sh > "$WORK/image-tarball"'
    assert commands[1].endswith(" | grep -xF docker.io/library/" + written[0].split()[3])
    assert any(c.startswith("helm install dstream helm/dstream") for c in commands)
    assert "kubectl port-forward svc/wordcount-driver $PORT:8000 &" in commands
    assert commands[-1].startswith("curl ") and "localhost:$PORT/metrics" in commands[-1]
