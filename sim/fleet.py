"""One run of a scenario under one policy and one seed: a discrete-event simulation in virtual
time of the engine pods, the Service spreading requests over them, Prometheus scraping them,
an HPA-like autoscaler, and (policy `auto`) the operator taking its turns.

Events are (time, order) in a heap; each pod runs its iterations back to back while it has
work, so the clock jumps from one iteration's end to the next. Virtual time 0 is `EPOCH`, a
unix time: the operator's datetimes and the engines' exploration leases share that clock.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spectune.engine.device_time import SKUS
from spectune.engine.gate import GateSettings, Lease
from spectune.operator.observations import MetricsUnavailable
from spectune.operator.tuning import Turn
from spectune.sim.arrivals import Arrival
from spectune.sim.engine_pod import PodConfig, Request, SimEngine
from spectune.sim.operator_loop import SimOperator
from spectune.sim.results import (
    Calibration,
    OperatorEvent,
    Run,
    ThresholdPoint,
    Window,
    Workload,
)
from spectune.sim.scenario import (
    Migrate,
    OperatorRestart,
    Policy,
    PrometheusOutage,
    Scale,
    Scenario,
)
from spectune.sim.scrapes import KEEP_SECONDS, Scrapes

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SAMPLE_SECONDS = 5.0  # how often the running batch and ready pods are sampled for the report
# The Events that end a calibration, for the report's trigger -> decision times.
DECISIONS = (
    "ThresholdChanged", "ThresholdKept", "ThresholdRecommended", "CalibrationFailed",
    "CalibrationAborted", "CalibrationCancelled", "CalibrationRestarted",
)  # fmt: skip


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a run steps. A run makes no reference cycles
    (its objects die by reference count: tests/sim/test_fleet.py), so the collector found
    nothing, and its passes over the run's millions of live objects (arrivals, requests,
    sequences) were a sixth of a 256-pod fleet's CPU."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def gate_settings(policy: Policy) -> GateSettings:
    """A fixed policy's gate: never (0), always (unset) or a threshold; no exploration."""
    if policy == "never":
        return GateSettings(threshold=0)
    if policy == "always":
        return GateSettings(threshold=None)
    assert isinstance(policy, int)
    return GateSettings(threshold=policy)


def from_target(threshold: int | None, exploration: float, lease: Any) -> GateSettings:
    """What an engine runs after the admin API's PUT (or reading the ConfigMap), its SKU's
    threshold picked."""
    return GateSettings(
        threshold=threshold,
        exploration=exploration,
        lease=Lease(lease["exploration"], lease["until"], lease.get("below")) if lease else None,
    )


@dataclass(eq=False)
class Pod:
    name: str
    sku: str
    engine: SimEngine
    created: float
    ready_at: float | None = None
    draining_since: float | None = None
    busy: bool = False
    gone: bool = False

    @property
    def serving(self) -> bool:
        return self.ready_at is not None and self.draining_since is None and not self.gone


@dataclass
class Tally:
    """Fleet-wide samples for one report window."""

    running: float = 0.0
    pods: float = 0.0
    samples: int = 0
    decode: int = 0
    explored: int = 0
    tokens: int = 0


@dataclass
class FleetSim:
    scenario: Scenario
    policy: Policy
    seed: int
    arrivals: list[Arrival]
    duration: float
    progress: Callable[[float], None] | None = None
    per_iteration: bool = False  # SimEngine's reference path
    now: float = EPOCH
    pods: list[Pod] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        sc = self.scenario
        self._heap: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._order = itertools.count()
        self._route = random.Random(self.seed * 7919 + 1)
        self._serving: list[Pod] | None = None  # see _serving_pods
        self._names = itertools.count()
        self.desired = {p.sku: p.replicas for p in sc.fleet.pools}
        self.spec = sc.spec.model_copy(update={"replicas": sc.replicas})
        self.scrapes = Scrapes(sc.operator.scrape_interval_s)
        self.prometheus_up = True
        self.operator_up = True
        self.operator = SimOperator(sc.name, sc.operator.exploration_lease_s)
        self.auto = self.policy == "auto"
        # the ConfigMap's speculation section (auto): a new pod reads its SKU's threshold there
        self.configmap: dict[str, Any] | None = None
        self.events: list[OperatorEvent] = []
        self.points: list[ThresholdPoint] = []
        self._last_points: dict[str, tuple[int | None, float | None]] = {}
        self._hpa: list[tuple[float, int]] = []
        self._tally = Tally()  # this window's samples
        self._gone = Tally()  # what removed pods' engines did
        self._last = Tally()  # the totals at the last window's end
        self._triggers: list[str] = []  # each calibration's trigger, in order
        self.windows: list[Window] = []
        self._open: list[Request] = []  # requests not ended when the last window ended
        self._seen = 0  # of self.requests, those that arrived before the last window ended
        bulk = sc.bulk.slo if sc.bulk else None
        self._slo = {"bulk": (bulk.ttft_ms / 1e3, bulk.tpot_ms / 1e3)} if bulk else {}

    # --- the event loop -----------------------------------------------------------

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._order), fn, args))

    def run(self) -> None:
        with collector_paused():
            self._run()

    def _run(self) -> None:
        start = EPOCH
        if self.auto:
            self._turn()  # the first turn writes the ConfigMap the pods start from
        self._reconcile(startup=0.0)  # the fleet is up when the run starts
        # the arrivals in order, each pushed when the one before it arrives: a 256-pod hour has
        # 15 million, and a heap of them all took gigabytes and a deeper push for every
        # iteration. They keep the places in the order (for events at the same instant) that
        # pushing them all now would give.
        self._arriving = sum(1 for a in self.arrivals if a.at < self.duration)
        self._first_arrival = next(self._order)
        self._order = itertools.count(self._first_arrival + self._arriving)
        self._next_arrival(0)
        for e in self.scenario.events:
            if isinstance(e, Scale | Migrate | PrometheusOutage | OperatorRestart):
                self.at(start + e.at_s, self._event, e)
        if self.scenario.autoscaler:
            self.at(start + self.scenario.autoscaler.period_s, self._autoscale)
        self.at(start + SAMPLE_SECONDS, self._sample)
        self.at(start + self.scenario.window_s, self._window)
        end = start + self.duration
        next_progress = start
        while self._heap and self._heap[0][0] <= end:
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            fn(*args)
            if self.progress and t >= next_progress:
                self.progress((t - start) / self.duration)
                next_progress = t + 60.0
        self.now = end
        if not self.windows or self.windows[-1].start_s + self.scenario.window_s < self.duration:
            self._window(reschedule=False)

    # --- requests -----------------------------------------------------------------

    def _next_arrival(self, index: int) -> None:
        if index < self._arriving:
            t = EPOCH + self.arrivals[index].at
            heapq.heappush(self._heap, (t, self._first_arrival + index, self._arrive, (index,)))

    def _arrive(self, index: int) -> None:
        self._next_arrival(index + 1)
        a = self.arrivals[index]
        request = Request(
            index, self.now, a.prompt_tokens, a.output_tokens, a.acceptance, a.workload,
            self._slo.get(a.workload),
        )  # fmt: skip
        self.requests.append(request)
        serving = self._serving_pods()
        if not serving:  # a Service without endpoints: the connection is refused
            request.outcome, request.done_at = "rejected", self.now
            return
        if self.scenario.fleet.routing == "least-loaded":
            pod = min(serving, key=lambda p: p.engine.load)
        else:
            pod = serving[self._route.randrange(len(serving))]
        if pod.engine.submit(request, self.now) and not pod.busy:
            pod.busy = True
            self.at(self.now, self._step, pod)

    def _serving_pods(self) -> list[Pod]:
        """The pods serving, in creation order: kept between the changes that move a pod in or
        out (ready, draining, removed), since every arrival picks from them (the list built
        afresh per request was a fifth of a 256-pod run's time)."""
        if self._serving is None:
            self._serving = [p for p in self.pods if p.serving]
        return self._serving

    def _step(self, pod: Pod) -> None:
        seconds = pod.engine.step(self.now)
        if seconds is None:
            pod.busy = False
            if pod.draining_since is not None and not pod.engine.has_work():
                self._remove(pod)
            return
        self.at(self.now + seconds, self._step, pod)

    # --- pods ---------------------------------------------------------------------

    def _config_gate(self, pod_sku: str) -> GateSettings:
        """What an engine on `pod_sku` runs from the ConfigMap as it is now."""
        if not self.auto:
            return gate_settings(self.policy)
        if (s := self.configmap) is None:
            return GateSettings()
        threshold = s["thresholds"].get(SKUS[pod_sku].product, s["threshold"])
        return from_target(threshold, s["exploration"], None)

    def _config(self, pod_sku: str) -> PodConfig:
        sc, spec = self.scenario, self.spec
        return PodConfig(
            sku=SKUS[pod_sku],
            method=spec.speculation.method,
            k=spec.speculation.numSpeculativeTokens,
            max_batch_size=spec.engine.maxBatchSize,
            kv_cache_bytes=int(sc.kv_cache_gib(pod_sku) * 2**30),
            max_model_len=sc.fleet.max_model_len,
            max_queue=sc.fleet.max_queue,
            ttft_s=spec.slo.ttftMilliseconds / 1e3,
            tpot_s=spec.slo.tpotMilliseconds / 1e3,
        )

    def _reconcile(self, startup: float | None = None) -> None:
        """Pods to the desired count per pool: new ones start (ready after `startup`, default
        the fleet's startup_s), the newest surplus ones drain."""
        if startup is None:
            startup = self.scenario.fleet.startup_s
        for sku, want in self.desired.items():
            live = [p for p in self.pods if p.sku == sku and p.draining_since is None]
            for _ in range(want - len(live)):
                n = next(self._names)
                name = f"{self.scenario.name}-{sku.lower()}-{n}"
                seed = self.seed * 100_003 + n
                engine = SimEngine(
                    name, self._config(sku), self._config_gate(sku), seed, self.per_iteration
                )
                pod = Pod(name, sku, engine, self.now)
                self.pods.append(pod)
                self.at(self.now + startup, self._ready, pod)
            surplus = sorted(live, key=lambda p: (p.ready_at is not None, p.created))
            for pod in surplus[: max(0, len(live) - want)]:
                pod.draining_since = self.now
                self._serving = None
                if not pod.busy:
                    self._remove(pod)
        self.spec = self.spec.model_copy(update={"replicas": sum(self.desired.values())})
        self.operator.generation += 1

    def _ready(self, pod: Pod) -> None:
        if pod.draining_since is not None:
            return
        pod.ready_at = self.now
        self._serving = None
        pod.engine.gate.settings = self._config_gate(pod.sku)  # the ConfigMap as it is now
        offset = self._route.random() * self.scrapes.interval
        self.at(self.now + offset, self._scrape, pod)

    def _remove(self, pod: Pod) -> None:
        pod.gone = True
        self._serving = None
        self.scrapes.remove(pod.name, self.now)
        self.pods.remove(pod)
        self._retired(pod)

    def _retired(self, pod: Pod) -> None:
        e = pod.engine
        self._gone.decode += e.decode_iterations
        self._gone.explored += e.explored_iterations
        self._gone.tokens += e.decode_tokens

    def _scrape(self, pod: Pod) -> None:
        if pod.gone:
            return
        if self.prometheus_up:
            self.scrapes.scrape(pod.name, self.now, pod.engine.sample())
        self.at(self.now + self.scrapes.interval, self._scrape, pod)

    # --- scenario events and the autoscaler ---------------------------------------

    def _event(self, e: Scale | Migrate | PrometheusOutage | OperatorRestart) -> None:
        if isinstance(e, Scale):
            self.desired[e.sku or self.scenario.fleet.pools[0].sku] = e.replicas
            self._reconcile()
        elif isinstance(e, Migrate):
            moved = self.desired.get(e.from_sku, 0)
            self.desired[e.to_sku] = self.desired.get(e.to_sku, 0) + moved
            self._reconcile()
            self.at(self.now + self.scenario.fleet.startup_s, self._retire_pool, e.from_sku)
        elif isinstance(e, PrometheusOutage):
            self.prometheus_up = False
            self.at(self.now + e.duration_s, setattr, self, "prometheus_up", True)
        else:
            self.operator_up = False
            self.at(self.now + e.down_s, self._operator_back)

    def _retire_pool(self, sku: str) -> None:
        self.desired[sku] = 0
        self._reconcile()

    def _operator_back(self) -> None:
        self.operator.restart()
        self.operator_up = True

    def _autoscale(self) -> None:
        """HPA: desired = ceil(sum of the metric / target) over ready pods, within bounds;
        down only to the highest desire of the stabilisation window."""
        hpa = self.scenario.autoscaler
        assert hpa is not None
        ready = self._serving_pods()
        if ready:
            sched = [p.engine.scheduler for p in ready]
            total = sum(len(s.running if hpa.metric == "running" else s.waiting) for s in sched)
            want = min(hpa.max, max(hpa.min, math.ceil(total / hpa.target)))
            self._hpa = [(t, w) for t, w in self._hpa if t > self.now - hpa.stabilization_s]
            self._hpa.append((self.now, want))
            pool = max(self.desired, key=lambda s: self.desired[s])
            current = self.desired[pool]
            target = want if want > current else max(w for _, w in self._hpa)
            if target != current:
                self.desired[pool] = target
                self._reconcile()
        self.at(self.now + hpa.period_s, self._autoscale)

    # --- the operator -------------------------------------------------------------

    def _pod_dict(self, pod: Pod) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": pod.name}
        if pod.draining_since is not None:
            meta["deletionTimestamp"] = _iso(pod.draining_since)
        ready = {"type": "Ready", "status": "True" if pod.ready_at is not None else "False"}
        if pod.ready_at is not None:
            ready["lastTransitionTime"] = _iso(pod.ready_at)
        return {"metadata": meta, "status": {"podIP": "127.0.0.1", "conditions": [ready]}}

    def _turn(self) -> None:
        if self.operator_up:
            self._take_turn()
        self.at(self.now + self.scenario.operator.resync_s, self._turn)

    def _take_turn(self) -> None:
        pods = [self._pod_dict(p) for p in self.pods]
        live = [p for p in self.pods if p.draining_since is None]
        ready = sum(p.ready_at is not None for p in live)
        rollout = {"replicas": len(live), "readyReplicas": ready, "updatedReplicas": len(live)}
        now = self.now

        def read(seconds: int) -> Any:
            if not self.prometheus_up:
                raise MetricsUnavailable("connection refused (a simulated Prometheus outage)")
            return self.scrapes.read(now, seconds)

        turn = self.operator.turn(now, self.spec, pods, rollout, read)
        for event in turn.events:
            if event.reason == "CalibrationStarted":
                self._triggers.append(turn.state.calibration.trigger or "")
            self.events.append(
                OperatorEvent(at_s=now - EPOCH, reason=event.reason, message=event.message,
                              warning=event.warning)
            )  # fmt: skip
        self._act(turn)

    def _act(self, turn: Turn) -> None:
        """After the commit: the ConfigMap for pods that start later, each ready engine to
        its target after the push's delay, and the threshold timeline."""
        self.configmap = turn.config["speculation"]
        delay = self.scenario.operator.settings_delay_s
        by_name = {p.name: p for p in self.pods}
        crossovers = {p.sku: p.batchSize for p in turn.state.per_sku}
        for target in turn.engines:
            pod = by_name.get(target.pod)
            if pod is not None:
                product = SKUS[pod.sku].product
                threshold = target.threshold_on(product)
                wanted = from_target(threshold, target.exploration, target.lease)
                self.at(self.now + delay, self._push, pod, wanted)
                self._point(product, threshold, crossovers.get(product))

    def _push(self, pod: Pod, wanted: GateSettings) -> None:
        if not pod.gone and pod.engine.gate.settings != wanted:
            pod.engine.gate.settings = wanted

    def _point(self, sku: str, threshold: int | None, crossover: float | None) -> None:
        if self._last_points.get(sku) != (threshold, crossover):
            self._last_points[sku] = (threshold, crossover)
            self.points.append(
                ThresholdPoint(at_s=self.now - EPOCH, sku=sku, threshold=threshold,
                               crossover=crossover)
            )  # fmt: skip

    # --- the report's windows -----------------------------------------------------

    def _sample(self) -> None:
        ready = self._serving_pods()
        self._tally.running += sum(len(p.engine.scheduler.running) for p in ready)
        self._tally.pods += len(ready)
        self._tally.samples += 1
        self.scrapes.forget(self.now - KEEP_SECONDS)
        self.at(self.now + SAMPLE_SECONDS, self._sample)

    def _totals(self) -> Tally:
        engines = [p.engine for p in self.pods]
        return Tally(
            decode=sum(e.decode_iterations for e in engines) + self._gone.decode,
            explored=sum(e.explored_iterations for e in engines) + self._gone.explored,
            tokens=sum(e.decode_tokens for e in engines) + self._gone.tokens,
        )

    def _window(self, reschedule: bool = True) -> None:
        w = self.scenario.window_s
        start = self.windows[-1].start_s + w if self.windows else 0.0
        end = min(start + w, self.now - EPOCH)
        totals, t = self._totals(), self._tally
        decode, explored = totals.decode - self._last.decode, totals.explored - self._last.explored
        tokens = totals.tokens - self._last.tokens
        self._last = totals
        # the requests that can end in this window: those still open when the last one ended,
        # and those that arrived since (every window scanning every request made a fleet's
        # hour quadratic in its requests)
        pool = self._open + self.requests[self._seen :]
        self._seen = len(self.requests)
        done = [r for r in pool if r.done_at is not None and start <= r.done_at - EPOCH < end]
        self._open = [r for r in pool if r.done_at is None or r.done_at - EPOCH >= end]
        seconds = max(end - start, 1e-9)
        slo_met = sum(r.slo_met for r in done)
        thresholds = {}
        for p in self.pods:
            if p.serving:
                thresholds.setdefault(p.engine.config.sku.product, p.engine.gate.settings.threshold)
        self.windows.append(
            Window(
                start_s=start,
                seconds=end - start,
                arrivals=sum(1 for r in pool if start <= r.arrival - EPOCH < end),
                finished=sum(r.outcome == "ok" for r in done),
                rejected=sum(r.outcome == "rejected" for r in done),
                slo_met=slo_met,
                goodput=slo_met / seconds,
                decode_tokens_per_s=tokens / seconds,
                tpot_p50_ms=tpot_median_ms(done),
                mean_running=t.running / t.pods if t.pods else 0.0,
                pods=t.pods / t.samples if t.samples else 0.0,
                explored_share=explored / decode if decode else 0.0,
                thresholds=thresholds,
                slo_met_by_workload=self._by_workload(done, lambda rs: sum(r.slo_met for r in rs)),
            )
        )
        self._tally = Tally()
        if reschedule:
            self.at(self.now + w, self._window)

    # --- the result ---------------------------------------------------------------

    def result(self, wall_seconds: float) -> Run:
        finished = sum(r.outcome == "ok" for r in self.requests)
        rejected = sum(r.outcome == "rejected" for r in self.requests)
        slo_met = sum(r.slo_met for r in self.requests)
        totals = self._totals()
        label = self.policy if isinstance(self.policy, str) else str(self.policy)
        return Run(
            policy=label,
            seed=self.seed,
            requests=len(self.requests),
            finished=finished,
            rejected=rejected,
            slo_met=slo_met,
            goodput=slo_met / self.duration,
            decode_tokens_per_s=totals.tokens / self.duration,
            tpot_p50_ms=tpot_median_ms(self.requests),
            explored_share=totals.explored / totals.decode if totals.decode else 0.0,
            iterations=totals.decode,
            windows=self.windows,
            thresholds=self.points,
            events=self.events,
            calibrations=calibrations(self.events, self._triggers),
            prometheus_queries=self.scrapes.queries,
            wall_seconds=wall_seconds,
            workloads=self._by_workload(self.requests, self._workload),
        )

    def _by_workload(
        self, requests: list[Request], summary: Callable[[list[Request]], Any]
    ) -> dict[str, Any]:
        """`summary` of each class's requests, with a bulk class; else nothing."""
        if self.scenario.bulk is None:
            return {}
        return {
            name: summary([r for r in requests if r.workload == name])
            for name in ("interactive", "bulk")
        }

    def _workload(self, requests: list[Request]) -> Workload:
        slo_met = sum(r.slo_met for r in requests)
        return Workload(
            requests=len(requests),
            finished=sum(r.outcome == "ok" for r in requests),
            slo_met=slo_met,
            goodput=slo_met / self.duration,
            tpot_p50_ms=tpot_median_ms(requests),
        )


def calibrations(events: list[OperatorEvent], triggers: list[str]) -> list[Calibration]:
    """Each CalibrationStarted (with its trigger) paired with the first Event that decided it."""
    out: list[Calibration] = []
    open_: dict[str, Any] | None = None
    started = iter(triggers)
    for e in events:
        if e.reason == "CalibrationStarted":
            open_ = {"trigger": next(started, ""), "started_s": e.at_s}
        elif open_ is not None and e.reason in DECISIONS:
            out.append(Calibration(**open_, decided_s=e.at_s, outcome=e.reason))
            open_ = None
    if open_ is not None:
        out.append(Calibration(**open_, decided_s=None, outcome="running"))
    return out


def tpot_median_ms(requests: list[Request]) -> float:
    """The median time per output token after the first, over finished requests; 0: none."""
    tpots = sorted(
        (r.done_at - r.first_token_at) / (r.output_tokens - 1)
        for r in requests
        if r.outcome == "ok" and r.output_tokens > 1 and r.done_at and r.first_token_at
    )
    return 1e3 * statistics.median(tpots) if tpots else 0.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def simulate_run(
    scenario: Scenario,
    policy: Policy,
    seed: int,
    arrivals: list[Arrival],
    duration: float,
    progress: Callable[[float], None] | None = None,
    per_iteration: bool = False,
) -> Run:
    wall = time.perf_counter()
    sim = FleetSim(scenario, policy, seed, arrivals, duration, progress, per_iteration)
    sim.run()
    return sim.result(time.perf_counter() - wall)
