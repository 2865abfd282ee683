"""The Compare bundle (``app.compare_bundle``): what the GUI's Compare view and the HTML report
show beyond the comparison, assembled in one place; what needs the stored requests is only there
when the store is."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.compare_bundle import compare_extras, compare_with_extras
from app.cost import price_table
from app.store import RunStore
from tests.unit.test_cost_capacity import _requests_run
from tests.unit.test_cost_goodput import _good_and_all


def test_the_bundle_counts_from_the_store_only_what_the_store_holds(tmp_path: Path) -> None:
    with RunStore(tmp_path / "bundle.db") as store:
        base_id, records = _requests_run(store, "ttft_ms<=400")
        other, _ = _requests_run(store, "ttft_ms<=400", seed=8)
        comparison, stored = compare_with_extras(store, [base_id, other], prices=price_table(["H100=4.00"]))
    unstored = compare_extras(comparison, prices=price_table(["H100=4.00"]))
    good, total = _good_and_all(records, 400)
    assert len(stored.headlines) == len(stored.money_lines) == 1  # one run against the baseline
    assert [h.sentence() for h in unstored.headlines] == [h.sentence() for h in stored.headlines]
    assert unstored.money_lines == stored.money_lines and unstored.load_start_s == stored.load_start_s
    base = stored.costs[0]
    assert base.price is not None and base.price.usd_per_hour == 4.00 and base.output.usd is not None
    assert base.good_output is not None and base.good_output.usd is not None
    assert base.good_output.usd == pytest.approx(base.output.usd * total / good)  # dearer: fewer tokens count
    assert stored.good_slo_text == "Good output: the requests that met the runs' SLO 'ttft_ms<=400'."
    assert [d.run_id for d in stored.distributions] == [base_id, other]
    # Without the store: the same costs at the same prices, but nothing counted from stored requests.
    assert [c.output for c in unstored.costs] == [c.output for c in stored.costs]
    assert all(c.good_output is None for c in unstored.costs)
    assert unstored.good_slo_text == "" and unstored.distributions == []
