"""Id contiguity (``service/loadtest/checks.py``)."""

from __future__ import annotations

from service.loadtest.checks import check_ids


def test_id_check_flags_gaps_and_repeats() -> None:
    assert check_ids([1, 2, 3, 4]) == (0, 0)
    assert check_ids([6, 7], after=5) == (0, 0)
    assert check_ids([1, 2, 4, 5]) == (1, 0)  # 3 lost
    assert check_ids([1, 2, 2, 3]) == (0, 1)  # 2 twice
    assert check_ids([1, 2, 5, 5, 6]) == (2, 1)
    assert check_ids([2], after=0) == (1, 0)  # the first after `after` missing
    # Merged assistant_text events cover first_id..id.
    assert check_ids([(1, 1), (2, 9), (10, 10)]) == (0, 0)
    assert check_ids([(1, 1), (3, 9), (10, 10)]) == (1, 0)
    assert check_ids([(1, 5), (4, 9)]) == (0, 2)  # 4 and 5 again
    assert check_ids([(1, 5), (1, 5)]) == (0, 5)
