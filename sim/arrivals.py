"""The requests a scenario sends: arrival offsets, lengths and each request's acceptance rate,
drawn once per seed and shared by every policy (common random numbers: a policy is compared
with another under the very same arrivals)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from spectune.engine.bench.trace_file import load_trace
from spectune.sim.scenario import (
    Acceptance,
    AcceptanceShift,
    ContextShift,
    LoadShift,
    Scenario,
    SyntheticSource,
)


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float  # seconds after the run starts
    prompt_tokens: int
    output_tokens: int
    acceptance: float  # each drafted token is accepted with this probability
    workload: str = "interactive"  # or "bulk": the scenario's second class


def draw_acceptance(rng: random.Random, a: Acceptance | AcceptanceShift) -> float:
    """A Beta draw with the given mean and standard deviation (the spread is capped where no
    Beta has it: at most sqrt(mean (1 - mean)))."""
    m, s = a.mean, a.spread
    if s == 0 or m in (0.0, 1.0):
        return m
    s = min(s, 0.99 * math.sqrt(m * (1 - m)))
    k = m * (1 - m) / (s * s) - 1
    return rng.betavariate(m * k, (1 - m) * k)


def _timed(scenario: Scenario) -> list[tuple[float, int, int]]:
    """(offset, prompt, output) in run time, before shifts."""
    source = scenario.traffic
    rng = random.Random(0)  # the trace's copies are offset alike in every seed
    if isinstance(source, SyntheticSource):
        return []
    trace = load_trace(source.name)
    end = source.start_s + source.duration_s if source.duration_s else math.inf
    out = []
    for r in trace.requests:
        if source.start_s <= r.offset_s < end:
            prompt = max(1, round(r.context_tokens * source.scale))
            output = max(1, round(r.generated_tokens * source.scale))
            at = (r.offset_s - source.start_s) / source.speed
            out.append((at, prompt, output))
            for _ in range(source.copies - 1):
                out.append((at + rng.random() / source.speed, prompt, output))
    return sorted(out)


def duration(scenario: Scenario, requests: list[Arrival]) -> float:
    """Virtual seconds a run lasts: the synthetic duration or the trace slice's at its speed,
    else up to the last of `requests` (the run's arrivals: the trace is not read again)."""
    source = scenario.traffic
    if source.duration_s:
        return source.duration_s / (1.0 if isinstance(source, SyntheticSource) else source.speed)
    return max((a.at for a in requests), default=0.0)


def arrivals(scenario: Scenario, seed: int) -> list[Arrival]:
    """Every request of one run, in arrival order."""
    rng = random.Random(seed)
    source = scenario.traffic
    if isinstance(source, SyntheticSource):
        timed, t = [], rng.expovariate(source.rate)
        while t < source.duration_s:
            timed.append((t, source.prompt_tokens, source.output_tokens))
            t += rng.expovariate(source.rate)
    else:
        timed = _timed(scenario)
    shifts = sorted(
        (e for e in scenario.events if isinstance(e, AcceptanceShift | ContextShift | LoadShift)),
        key=lambda e: e.at_s,
    )
    out = []
    for at, prompt, output in timed:
        accept: Acceptance | AcceptanceShift = scenario.acceptance
        context = load = 1.0
        for e in shifts:
            if e.at_s <= at:
                if isinstance(e, AcceptanceShift):
                    accept = e
                elif isinstance(e, ContextShift):
                    context = e.scale
                else:
                    load = e.scale
        copies = int(load) + (rng.random() < load - int(load))
        for _ in range(copies):
            acceptance = draw_acceptance(rng, accept)
            out.append(Arrival(at, max(1, round(prompt * context)), output, acceptance))
    if scenario.bulk is None:
        return out
    bulk = _bulk(scenario, seed, len(out), duration(scenario, out))
    return sorted(out + bulk, key=lambda a: a.at)


def _bulk(scenario: Scenario, seed: int, interactive: int, seconds: float) -> list[Arrival]:
    """The bulk class's Poisson arrivals over `seconds`: `share` of all requests on average,
    drawn from their own generator so that the interactive requests are the same with or
    without them."""
    bulk = scenario.bulk
    assert bulk is not None
    rate = interactive * bulk.share / (1 - bulk.share) / seconds if seconds > 0 else 0.0
    if rate <= 0:
        return []
    rng = random.Random(seed * 1_000_003 + 2)
    accept = bulk.acceptance or scenario.acceptance
    out, t = [], rng.expovariate(rate)
    while t < seconds:
        out.append(
            Arrival(t, bulk.prompt_tokens, bulk.output_tokens, draw_acceptance(rng, accept), "bulk")
        )
        t += rng.expovariate(rate)
    return out
