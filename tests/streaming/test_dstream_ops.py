"""Every DStream operation over several batches, with exact expected outputs."""

from __future__ import annotations

import pytest
from cases import CASES, Case
from streams import run_op


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_operation(sc, case: Case, tmp_path):
    def op(*streams):
        if case.stateful:
            streams[0].context().checkpoint(str(tmp_path / "checkpoint"))
        return case.op(*streams)

    results = run_op(
        sc,
        case.inputs,
        op,
        batches=len(case.expected),
        sort=case.sort,
        inputs2=case.inputs2,
        batch_seconds=case.batch_seconds,
    )
    assert results == case.expected
