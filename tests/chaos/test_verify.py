"""The chaos verifier's rule for batch times: one interval apart, unless coalesced."""

from e2e.chaos.verify import unexplained_gaps


def test_consecutive_batch_times_have_no_gap():
    assert unexplained_gaps([1000, 2000, 3000], {}, 1000) == []


def test_a_missing_batch_time_is_a_gap():
    assert unexplained_gaps([1000, 2000, 4000], {}, 1000) == [2000]


def test_times_coalesced_into_the_next_batch_explain_the_gap():
    assert unexplained_gaps([1000, 4000, 5000], {4000: [2000, 3000]}, 1000) == []


def test_a_coalesced_list_that_leaves_a_time_out_is_still_a_gap():
    assert unexplained_gaps([1000, 4000], {4000: [3000]}, 1000) == [1000]
