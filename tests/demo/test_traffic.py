"""The demo's clients against a real engine: fewer clients let the extra ones finish the
request they are on (a request cut off would count on the engine as an error, which the
operator's goodput check would read as the threshold's doing)."""

from __future__ import annotations

import asyncio
import time

from spectune.demo.traffic import Fleet
from spectune.engine import contract
from spectune.engine.bench.schema import Slo
from tests.server.metrics_text import parse, total
from tests.server.support import start_server, stop_server


def live(fleet: Fleet) -> list[int]:
    return sorted(i for i, w in fleet.workers.items() if not w.done())


def test_fewer_clients_finish_their_requests_and_stop(tiny_pair, tmp_path) -> None:
    served = start_server(tmp_path, {"model": "tiny-target", "method": "none"})

    async def run() -> tuple[list[int], int, str]:
        fleet = Fleet(Slo(ttft_ms=10_000, tpot_ms=10_000))
        try:
            await fleet.set([served.url], 6, 1.0)
            # six requests answered before the cut (about 3 s here; a fixed 3 s answered none
            # beside a busy suite), so that at least seven are when the extra four have stopped
            deadline = time.monotonic() + 120
            while len(fleet.results) < 6 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await fleet.set([served.url], 2, 1.0)
            # the four extra clients stop once the request each is on is answered: seconds
            # here, longer on a busy machine
            deadline = time.monotonic() + 120
            while (running := live(fleet)) != [0, 1] and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            answered = (await fleet.tick({})).requests
            metrics = await asyncio.to_thread(lambda: served.get("/metrics").text)
        finally:
            await fleet.stop()  # cuts off the last two: not counted above
        return running, answered, metrics

    try:
        running, answered, metrics = asyncio.run(run())
    finally:
        stop_server(served)
    samples = parse(metrics)
    assert running == [0, 1]
    assert answered > 6
    assert total(samples, contract.REQUESTS, outcome="ok") >= answered
    assert total(samples, contract.REQUESTS, outcome="error") == 0
