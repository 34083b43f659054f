"""Admin API auth and validation; threshold changes (API and config file) steer the next
iterations, as the step metrics show; an exploration lease reverts by itself; every contract
metric is exposed."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest
import yaml

from spectune.engine import contract
from tests.support.waiting import wait_until

from .metrics_text import parse, total
from .support import Served

BODY = {
    "model": "tiny-target",
    "prompt": "def main():\n",
    "max_tokens": 24,
    "temperature": 0,
    "ignore_eos": True,
}


def run_load(server: Served, n: int = 3) -> None:
    for _ in range(n):
        assert server.post("/v1/completions", json=BODY).status_code == 200


def counters(server: Served) -> dict[str, float]:
    samples = parse(server.get("/metrics").text)
    return {
        "spec_tokens": total(samples, contract.STEP_OUTPUT_TOKENS, mode="spec"),
        "plain_tokens": total(samples, contract.STEP_OUTPUT_TOKENS, mode="plain"),
        "accepted": total(samples, contract.SPEC_ACCEPTED_TOKENS),
        "drafted": total(samples, contract.SPEC_DRAFT_TOKENS),
    }


def wait_for_threshold(server: Served, value: int | None, timeout: float = 10) -> None:
    wait_until(
        f"threshold {value} (log: {server.log})",
        lambda: server.get("/admin/speculation").json()["threshold"] == value,
        timeout,
        0.2,
    )


def test_every_contract_metric_is_exposed(server: Served) -> None:
    run_load(server, 1)
    names = {name for name, _ in parse(server.get("/metrics").text)}
    for metric in contract.ALL_METRICS:
        assert any(n == metric or n.startswith(metric + "_") for n in names), metric
    info = [lab for (n, lab) in parse(server.get("/metrics").text) if n == contract.ENGINE_INFO]
    assert dict(info[0]) == {
        "device": "cpu",
        "simulated": "false",
        "model": "tiny-target",
        "draft": "tiny-draft",
        "version": "0.1.0",
    }


def test_the_startup_time_is_a_gauge_and_a_log_line(server: Served) -> None:
    """From the server's start to Ready: loading and the warm-up, a few seconds on the CPU."""
    seconds = total(parse(server.get("/metrics").text), contract.STARTUP_SECONDS)
    assert 0 < seconds < 600
    assert f"ready in {seconds:.1f} s: model=tiny-target" in server.log.read_text()


def test_admin_get_reports_settings_and_counts(server: Served) -> None:
    state = server.get("/admin/speculation").json()
    assert {"k", "threshold", "hysteresis", "exploration", "method", "running", "waiting"} <= set(
        state
    )
    assert state["method"] == "draft"
    assert state["lease"] is None and state["effective_exploration"] == state["exploration"]


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_admin_put_needs_the_token(server: Served, token: str | None) -> None:
    before = server.get("/admin/speculation").json()
    response = server.put_admin({"threshold": 3}, token=token)
    assert response.status_code == 401
    assert "token" in response.json()["error"]["message"]
    assert server.get("/admin/speculation").json() == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"threshold": -1}, "threshold"),
        ({"k": 0}, "k"),
        ({"exploration": 2}, "exploration"),
        ({"hysteresis": "x"}, "hysteresis"),
        ({"bogus": 1}, "bogus"),
        ({"threshold": 2.5}, "threshold"),
        ({"lease": {"exploration": 1.5, "until": 2e9}}, "lease.exploration"),
        ({"lease": {"exploration": 0.5}}, "lease.until"),
        ({"lease": {"exploration": 0.5, "until": 2e9, "below": 0}}, "lease.below"),
        ({"lease": 0.5}, "lease"),
        ([1, 2], "dictionary"),
        (None, "body"),
    ],
)
def test_admin_put_rejects_invalid_values_with_the_reason(
    server: Served, body: object, field: str
) -> None:
    response = server.put_admin(body)
    assert response.status_code == 422
    assert field in response.json()["error"]["message"]


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"k": 0}', b""])
def test_admin_put_checks_the_token_before_reading_the_body(server: Served, body: bytes) -> None:
    response = httpx.put(
        server.url + "/admin/speculation",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 401, response.text
    assert "token" in response.json()["error"]["message"]


def test_admin_put_changes_only_the_fields_given(server: Served) -> None:
    start = server.put_admin({"k": 4, "threshold": 6, "hysteresis": 1.0, "exploration": 0.0})
    assert start.status_code == 200
    state = server.put_admin({"k": 3}).json()
    assert (state["k"], state["threshold"], state["hysteresis"]) == (3, 6, 1.0)
    state = server.put_admin({"hysteresis": 2.5, "exploration": 0.1}).json()
    assert (state["k"], state["threshold"], state["hysteresis"], state["exploration"]) == (
        3,
        6,
        2.5,
        0.1,
    )
    assert server.put_admin({}).json()["threshold"] == 6  # absent: unchanged
    assert server.put_admin({"threshold": None}).json()["threshold"] is None  # null: always
    assert server.put_admin({"threshold": 0}).json()["threshold"] == 0  # 0: never
    restored = server.put_admin({"k": 4, "threshold": None, "hysteresis": 1.0, "exploration": 0})
    assert restored.json()["k"] == 4 and restored.json()["threshold"] is None


def exploration_gauge(server: Served) -> float:
    return total(parse(server.get("/metrics").text), contract.SPEC_EXPLORATION_RATIO)


def test_an_exploration_lease_reverts_by_itself(server: Served) -> None:
    """No request changes the settings after the PUT: expiry alone brings the base back, in the
    admin API, in the gauge and in the log."""
    assert server.put_admin({"exploration": 0.0, "lease": None}).status_code == 200
    logged = server.log.read_text().count("exploration lease expired at")
    lease = {"exploration": 0.5, "until": round(time.time() + 1.5, 3), "below": None}
    put = server.put_admin({"lease": lease})
    assert put.status_code == 200, put.text
    state = server.get("/admin/speculation").json()
    assert (state["lease"], state["exploration"], state["effective_exploration"]) == (
        lease,
        0.0,
        0.5,
    )
    assert exploration_gauge(server) == 0.5
    wait_until(
        "the lease to expire in the admin API",
        lambda: server.get("/admin/speculation").json()["effective_exploration"] == 0.0,
        6,
        0.1,
    )
    assert time.time() >= lease["until"]
    wait_until("the gauge back to the base share", lambda: exploration_gauge(server) == 0.0, 3, 0.1)
    wait_until(
        "the expiry logged",
        lambda: server.log.read_text().count("exploration lease expired at") > logged,
        3,
        0.1,
    )
    time.sleep(0.3)  # a few more idle passes of the loop: still logged once
    assert server.log.read_text().count("exploration lease expired at") == logged + 1
    state = server.get("/admin/speculation").json()
    assert state["lease"] == lease  # still there, and inert


def test_admin_put_keeps_the_lease_when_absent_and_drops_it_when_null(server: Served) -> None:
    lease = {"exploration": 0.25, "until": time.time() + 600, "below": 32}
    assert server.put_admin({"exploration": 0.0, "lease": lease}).json()["lease"] == lease
    state = server.put_admin({"threshold": 6}).json()  # absent: unchanged
    assert (state["lease"], state["effective_exploration"]) == (lease, 0.25)
    assert exploration_gauge(server) == 0.25
    state = server.put_admin({"lease": None, "threshold": None}).json()  # null: withdrawn
    assert (state["lease"], state["effective_exploration"]) == (None, 0.0)
    assert exploration_gauge(server) == 0.0


def prompt_tokens(server: Served) -> float:
    return total(parse(server.get("/metrics").text), contract.PROMPT_TOKENS)


def test_prompt_tokens_count_what_the_answered_requests_were_given(server: Served) -> None:
    """The operator's prompt-length signal: prompt tokens over successful requests."""
    before = prompt_tokens(server)
    given = 0
    for prompt in ("def main():\n", "import os\nimport sys\n\n\nclass Reader:\n    def "):
        answer = server.post("/v1/completions", json=BODY | {"prompt": prompt})
        assert answer.status_code == 200
        given += answer.json()["usage"]["prompt_tokens"]
    assert given > 0 and prompt_tokens(server) == before + given


@pytest.mark.parametrize("stream", [True, False])
def test_an_abandoned_request_counts_as_cancelled_and_stops(server: Served, stream: bool) -> None:
    """A client that goes away (a chat UI's stop button) is no error of the engine's: goodput
    alerts that counted it as one fired on every busy chat deployment."""

    def outcomes() -> tuple[float, ...]:
        samples = parse(server.get("/metrics").text)
        by_outcome = [
            total(samples, contract.REQUESTS, outcome=o)
            for o in ("cancelled", "error", "ok", "invalid")
        ]
        return (*by_outcome, total(samples, contract.PROMPT_TOKENS))

    cancelled, errors, oks, invalid, prompts = outcomes()
    body = BODY | {"max_tokens": 240, "stream": stream}  # the context holds 256
    url = server.url + "/v1/completions"
    if stream:
        with httpx.stream("POST", url, json=body, timeout=60) as response:
            assert response.status_code == 200
            assert any(line.startswith("data: {") for line in response.iter_lines())
        # the connection is closed after the first event: the server must end the request
    else:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up before the answer
            httpx.post(url, json=body, timeout=httpx.Timeout(60, read=0.05))
    wait_until(
        "the abandoned request counted as cancelled",
        lambda: outcomes()[0] >= cancelled + 1,
        15,
        0.1,
    )
    # its prompt is not counted: only answered requests' are
    assert outcomes() == (cancelled + 1, errors, oks, invalid, prompts)
    assert server.get("/admin/speculation").json()["running"] == 0  # and no longer runs


def test_admin_threshold_steers_the_next_iterations(server: Served) -> None:
    assert server.put_admin({"threshold": 0}).json()["threshold"] == 0
    before = counters(server)
    run_load(server)
    after = counters(server)
    assert after["plain_tokens"] > before["plain_tokens"]
    assert after["spec_tokens"] == before["spec_tokens"]
    assert after["accepted"] == before["accepted"] and after["drafted"] == before["drafted"]

    assert server.put_admin({"threshold": None}).json()["threshold"] is None
    run_load(server)
    again = counters(server)
    assert again["spec_tokens"] > after["spec_tokens"] and again["accepted"] > after["accepted"]
    assert again["plain_tokens"] == after["plain_tokens"]


def test_config_file_change_applies_and_an_invalid_file_is_rejected(server: Served) -> None:
    config = yaml.safe_load(server.config.read_text())
    config["speculation"]["threshold"] = 0
    server.config.write_text(yaml.safe_dump(config))
    wait_for_threshold(server, 0)
    before = counters(server)
    run_load(server)
    after = counters(server)
    assert (
        after["spec_tokens"] == before["spec_tokens"]
        and after["plain_tokens"] > before["plain_tokens"]
    )

    rejected = server.log.read_text().count("config file change rejected")
    config["speculation"]["threshold"] = -5
    server.config.write_text(yaml.safe_dump(config))
    wait_until(
        "the invalid file rejected",
        lambda: server.log.read_text().count("config file change rejected") > rejected,
        10,
        0.2,
    )
    assert server.get("/admin/speculation").json()["threshold"] == 0

    config["speculation"]["threshold"] = None
    server.config.write_text(yaml.safe_dump(config))
    wait_for_threshold(server, None)


def test_a_pushed_lease_outlives_config_file_changes_and_a_null_one_drops_it(
    server: Served,
) -> None:
    """The lease is the admin API's: the ConfigMap carries durable settings only, and a change
    to it (a threshold moved) keeps the lease a push granted; a file that says `lease: null`
    withdraws it. Before, every ConfigMap change dropped the pushed lease (or set the whole
    deployment's) until the next push."""
    original = server.config.read_text()
    lease = {"exploration": 0.3, "until": time.time() + 600, "below": 48}
    assert server.put_admin({"exploration": 0.0, "lease": lease}).status_code == 200
    config = yaml.safe_load(original)
    config["speculation"] |= {"exploration": 0.0, "threshold": 5}
    server.config.write_text(yaml.safe_dump(config))
    state = wait_until(
        "the file's threshold applied",
        lambda: (s := server.get("/admin/speculation").json())["threshold"] == 5 and s,
        10,
        0.2,
    )
    assert state["lease"] == lease and state["effective_exploration"] == 0.3
    assert exploration_gauge(server) == 0.3
    config["speculation"]["lease"] = None
    server.config.write_text(yaml.safe_dump(config))
    wait_until(
        "the lease dropped by the file's null",
        lambda: server.get("/admin/speculation").json()["lease"] is None,
        10,
        0.2,
    )
    assert exploration_gauge(server) == 0.0
    server.config.write_text(original)
    wait_for_threshold(server, None)


def test_each_engine_runs_its_own_skus_threshold_from_the_file_and_the_admin_api(
    server: Served,
) -> None:
    """The operator's per-SKU thresholds reach every engine as one map, in the ConfigMap and the
    admin API alike: an engine runs its own product's entry (this one's device is "cpu") and
    `threshold` where the map has none, so no SKU's threshold reaches another's pods (issue
    59, M)."""
    original = server.config.read_text()
    config = yaml.safe_load(original)
    config["speculation"] |= {"threshold": 16, "thresholds": {"cpu": 3, "NVIDIA-L4": 40}}
    server.config.write_text(yaml.safe_dump(config))
    state = wait_until(
        "this SKU's threshold from the file",
        lambda: (s := server.get("/admin/speculation").json())["threshold"] == 3 and s,
        10,
        0.2,
    )
    assert state["device"] == "cpu" and state["thresholds"] == {}  # resolved: what runs
    pushed = server.put_admin({"threshold": 8, "thresholds": {"NVIDIA-L4": 40, "cpu": 0}})
    assert pushed.json()["threshold"] == 0
    assert (
        server.put_admin({"threshold": 8, "thresholds": {"NVIDIA-L4": 40}}).json()["threshold"] == 8
    )  # none for this SKU: the deployment's
    assert server.put_admin({"thresholds": {"cpu": -1}}).status_code == 422
    server.config.write_text(original)
    wait_for_threshold(server, None)


def step_counts(server: Served) -> dict[tuple[str, str], float]:
    """Decode iterations so far by (mode, batch bucket), from the step histogram."""
    samples = parse(server.get("/metrics").text)
    return {
        (labels["mode"], labels["batch"]): value
        for (name, lab), value in samples.items()
        if name == contract.STEP_SECONDS + "_count" and (labels := dict(lab))
    }


def grown(before: dict, after: dict) -> dict:
    return {key: n - before.get(key, 0) for key, n in after.items() if n > before.get(key, 0)}


def test_step_metrics_split_by_mode_and_batch_bucket(server: Served) -> None:
    """Each phase's iterations land under its own mode and under the batch buckets it ran."""
    server.put_admin({"threshold": 0})
    start = step_counts(server)
    run_load(server, 1)
    middle = step_counts(server)
    plain = grown(start, middle)
    assert {mode for mode, _ in plain} == {"plain"} and ("plain", "1") in plain
    server.put_admin({"threshold": None})
    bodies = [BODY | {"max_tokens": 6 * (i + 1)} for i in range(6)]  # the batch shrinks 6 -> 1
    with httpx.Client(timeout=120) as client, cf.ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda b: client.post(server.url + "/v1/completions", json=b), bodies))
    spec = grown(middle, step_counts(server))
    assert {mode for mode, _ in spec} == {"spec"} and len(spec) >= 2
    assert all(int(bucket) in contract.BATCH_BUCKETS for _, bucket in spec)
