"""bench/admission_replay.py's trace slices (issue 44's outside check replays slices we do not see): a slice
offers the load asked, over the span asked, wherever it starts; a gap at its start is skipped, and where the
trace ends too soon it says so rather than squeezing every request into one instant."""

import argparse

import pytest

from bench.admission_replay import Pool
from bench.lib import trace_data as td
from bench.lib.admission_slices import fit, slice_load

CAL = {"s_per_prompt_token": 0.0015603, "s_per_output_token": 0.0126257}  # a CPU run's calibration


def _pool() -> Pool:
    args = argparse.Namespace(length_div=64, azure_length_div=8, max_input=256, max_output=256,
                              traces_dir=str(td.TRACES))  # fmt: skip
    return Pool(args, [], CAL, {}, "", {"work_rate": 2.48, "tok_s": 1349.0})


@pytest.mark.skipif(not td.TRACES.exists(), reason="../shared/traces is not here")
@pytest.mark.parametrize(
    ("name", "start_s", "load", "span_s"),
    [("azure_code", 600, 3.0, 61), ("azure_code", 2400, 2.0, 61), ("mooncake", 2400, 0.4, 45),
     ("azure_conv", 1800, 2.0, 90)],
)  # fmt: skip
def test_a_slice_offers_its_load_over_its_span(name: str, start_s: float, load: float, span_s: float) -> None:
    pool = _pool()
    trace, _ = fit(name, pool, start_s, load, span_s)
    stats = slice_load(trace, pool, span_s)
    assert stats["load"] == pytest.approx(load, rel=0.1)
    assert trace[0].t_ms < 5_000  # the slice starts at once (the code trace is silent for 116 s after 2,400)
    assert 0.8 * span_s <= stats["span_s"] <= span_s


@pytest.mark.skipif(not td.TRACES.exists(), reason="../shared/traces is not here")
def test_a_slice_past_the_traces_end_offers_less_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    pool = _pool()
    trace, _ = fit("azure_code", pool, 3300, 3.0, 61)  # the code trace ends at 3,436 s
    stats = slice_load(trace, pool, 61)
    assert stats["load"] < 2.9 and stats["span_s"] > 30  # spread over the span, not squeezed into an instant
    assert "warning" in capsys.readouterr().out
