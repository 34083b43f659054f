"""A server on a simulated SKU times requests on the SKU's modelled clock: the latencies and
the SLO it reports are the SKU's, not this CPU's, even where the CPU cannot keep up (every
iteration here overruns: the modelled time is scaled down 10,000-fold)."""

from __future__ import annotations

import time

import httpx

from spectune.engine import contract

from .metrics_text import parse, total
from .support import start_server, stop_server

REQUESTS = 4
BODY = {"model": "tiny-target", "prompt": "def add(a, b):", "max_tokens": 32, "ignore_eos": True}


def test_latencies_and_the_slo_are_measured_on_the_modelled_clock(tiny_pair, tmp_path) -> None:
    config = {
        "model": "tiny-target",
        "method": "none",
        "simulate_device": "H100",
        "simulate_time_scale": 1e-4,
        "slo": {"ttft_ms": 1, "tpot_ms": 1},  # unreachable on a wall clock: 32 CPU iterations
    }
    served = start_server(tmp_path, config)
    try:
        walls = []
        for _ in range(REQUESTS):
            t0 = time.monotonic()
            response = httpx.post(served.url + "/v1/completions", json=BODY, timeout=60)
            walls.append(time.monotonic() - t0)
            assert response.status_code == 200, response.text
        samples = parse(served.get("/metrics").text)
    finally:
        stop_server(served)
    assert total(samples, contract.REQUESTS_SLO_MET) == REQUESTS
    e2e_sum = total(samples, contract.E2E_REQUEST_LATENCY + "_sum")
    assert total(samples, contract.E2E_REQUEST_LATENCY + "_count") == REQUESTS
    # the modelled H100 decodes 32 tokens of an 8B model in about 0.3 s, here 30 us
    assert e2e_sum / REQUESTS < 0.01 * min(walls)
    assert total(samples, contract.SIMULATED_OVERRUNS) > 0
