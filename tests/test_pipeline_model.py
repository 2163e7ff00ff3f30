"""The pipeline's analytic model (Hyades appendix F, Dordis eq. 3) and its SimPy counterpart."""

from __future__ import annotations

import itertools

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.pipeline.performance import PerformanceModel, StageModel, fit_stage, fit_stages
from sim.pipeline.recurrence import DORDIS_RESOURCES, best_chunks, completion_time, finish_times
from sim.round.gates import StageGate


def simulate(latencies: list[float], resources: tuple[str, ...], chunks: int) -> list[list[float]]:
    """Finish times of every (stage, chunk) when each chunk is a SimPy process going through gated stages."""
    env = simpy.Environment()
    gates = {
        r: StageGate(env, r, tuple(s for s, rr in enumerate(resources) if rr == r), chunks) for r in set(resources)
    }
    f = [[float("nan")] * chunks for _ in resources]

    def chunk(c: int):  # type: ignore[no-untyped-def]
        for s, r in enumerate(resources):
            yield gates[r].admit(s, c)
            yield env.timeout(latencies[s])
            gates[r].release(s, c)
            f[s][c] = env.now

    for c in range(chunks):
        env.process(chunk(c))
    env.run()
    return f


def test_figure_6_by_hand() -> None:
    # Three chunks through Dordis Table 1's stages with latencies 2, 1, 3, 1, 2 (seconds), worked by hand:
    # c-comp runs stage 1 at 0-2, 2-4, 4-6; comm uploads at 2-3, 4-5, 6-7; s-comp at 3-6, 6-9, 9-12.
    # comm dispatches only once every upload is done (eq. 19: r(4, 0) = f(2, m-1) = 7): 7-8, 9-10, 12-13.
    # c-comp decodes after all its stage-1 work: 8-10, 10-12, 13-15.
    f = finish_times([2, 1, 3, 1, 2], DORDIS_RESOURCES, 3)
    assert f == [[2, 4, 6], [3, 5, 7], [6, 9, 12], [8, 10, 13], [10, 12, 15]]
    assert completion_time([2, 1, 3, 1, 2], DORDIS_RESOURCES, 3) == 15
    # One chunk: the stages back to back.
    assert completion_time([2, 1, 3, 1, 2], DORDIS_RESOURCES, 1) == 9


@settings(max_examples=200, deadline=None)
@given(
    latencies=st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=5, max_size=5),
    chunks=st.integers(1, 12),
)
def test_gated_simulation_reproduces_the_recurrence_exactly(latencies: list[float], chunks: int) -> None:
    assert simulate(latencies, DORDIS_RESOURCES, chunks) == finish_times(latencies, DORDIS_RESOURCES, chunks)


@settings(max_examples=100, deadline=None)
@given(
    latencies=st.lists(st.floats(0.01, 5.0), min_size=2, max_size=7),
    resources=st.lists(st.sampled_from("abc"), min_size=7, max_size=7),
    chunks=st.integers(1, 8),
)
def test_any_stage_layout(latencies: list[float], resources: list[str], chunks: int) -> None:
    layout = tuple(resources[: len(latencies)])
    assert simulate(latencies, layout, chunks) == finish_times(latencies, layout, chunks)


def test_eq3_given_betas_choose_the_best_m_by_enumeration() -> None:
    model = PerformanceModel(
        (
            StageModel(2e-6, 0.01, 0.05),
            StageModel(1e-6, 0.0, 0.02),
            StageModel(3e-6, 0.0, 0.1),
            StageModel(1e-6, 0.0, 0.02),
            StageModel(5e-7, 0.01, 0.01),
        )
    )
    d = 1_000_000
    best, times = model.best(d)
    assert times == {m: completion_time(model.latencies(d, m), DORDIS_RESOURCES, m) for m in range(1, 21)}
    assert best == min(times, key=lambda m: (times[m], m))
    assert times[1] == pytest.approx(2 + 1 + 3 + 1 + 0.5 + (0.01 + 0.05) + 0.02 + 0.1 + 0.02 + (0.01 + 0.01))
    assert times[best] < times[1]


def test_ties_go_to_fewer_chunks() -> None:
    best, times = best_chunks(lambda m: [1.0, 1.0], ("a", "a"), [1, 2, 3])
    assert best == 1 and times == {1: 2.0, 2: 4.0, 3: 6.0}


def test_fit_recovers_given_betas_exactly() -> None:
    truth = StageModel(3e-6, 0.02, 0.5)
    obs = [(d, m, truth.latency(d, m)) for d, m in itertools.product((10_000, 100_000, 1_000_000), (1, 2, 5, 10, 20))]
    fitted = fit_stage(obs)
    assert fitted.per_value == pytest.approx(truth.per_value, rel=1e-9)
    assert fitted.per_chunk == pytest.approx(truth.per_chunk, rel=1e-9)
    assert fitted.constant == pytest.approx(truth.constant, rel=1e-9)
    assert fitted.r2 == pytest.approx(1.0) and fitted.points == 15


def test_fit_is_non_negative_and_names_missing_stages() -> None:
    fitted = fit_stage([(1000, 1, 1.0), (1000, 2, 0.5), (1000, 4, 0.25)])  # pure d/m: no negative terms
    assert fitted.per_chunk >= 0 and fitted.constant >= 0
    with pytest.raises(ValueError, match="stage"):
        fit_stages([(0, 1000, 1, 1.0)], ("a", "b"))
