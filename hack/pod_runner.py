"""Pod runner: a real `spectune-engine serve` behind every Running engine pod of the local cluster.

kwok makes pods Running and gives them loopback IPs, but runs nothing. This runner plays the
container runtime for engine pods, so that Prometheus' pod discovery and the operator reach
real engines at the pods' IPs exactly as they would in a cluster:

- pods are those matching --selector (default `app.kubernetes.io/name=spectune-engine`, less
  those labelled `spectune.io/pod-runner: none`: the operator's scale benchmark asks for
  hundreds of pods whose engines nothing needs), in every namespace, that are Running, have a
  pod IP and are not being deleted;
- the container is the one named `engine`, else the first; the port is its containerPort named
  `http`, else its first containerPort;
- the engine's arguments are the container's `command` + `args`, less a leading
  `spectune-engine` and `serve` and any `--host`/`--port`, which become the pod IP and port;
- ConfigMap and Secret volumes the container mounts are written under --state-dir (and kept in
  step with the objects, as the kubelet does), hostPath volumes and claims bound to hostPath or
  local PersistentVolumes stand for those directories, and arguments under their mount paths
  are rewritten to those files and directories (read-only is not enforced);
- engines run on the CPU (SPECTUNE_DEVICE=cpu, which a pod's env overrides): the nodes' GPUs
  are fake; `env` values, ConfigMap/Secret key references and the pod's
  name, namespace, IP and node name as field references are passed on;
- an engine that exits is restarted with a back-off (restartPolicy Always); one whose pod goes
  away or changes IP is stopped as a kubelet stops a container: its preStop `sleep` first (it
  keeps serving meanwhile, while routing lets it go), then SIGTERM, then SIGKILL at the end of
  the pod's terminationGracePeriodSeconds; a new pod given the IP of an engine still stopping
  (kwok hands a freed IP out again at once, where a CNI would wait for the old sandbox) starts
  once that engine is gone;
- with --simulate-gpus (or SPECTUNE_SIMULATE_GPUS=1 in its environment), every engine runs on
  a simulated GPU: the SKU of its node's `nvidia.com/gpu.product` label, as a GPU driver makes
  the node's device visible (engine/simulated_device.py), slowed by --simulate-time-scale;
  a pod annotated `spectune.io/simulate-gpu: "true"` is simulated so even without the flag,
  and `spectune.io/simulate-time-scale` sets its own clock's slowdown,
  `spectune.io/simulate-context-scale` how many modelled cached tokens each real one counts as;
  a pod's own SPECTUNE_SIMULATE_* env wins, and a node without the label runs it on the CPU;
- the pod is Ready only while its engine answers GET /readyz with 200, as a kubelet's readiness
  probe would have it (kwok leaves pods unready): the runner writes the pod's Ready and
  ContainersReady conditions and the container's status (ready, restartCount, state) through
  the pods/status subresource, with the reason when it is not ready (still loading, exited,
  crash-looping), so that Deployments count only engines that serve.

It never runs an engine on an address outside 127.0.0.0/8: this machine may only send traffic
to loopback. Engines stay in the runner's process group, so stopping the group (as
`hack/cluster.sh down` does) stops them too.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ipaddress
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SELECTOR = "app.kubernetes.io/name=spectune-engine,spectune.io/pod-runner!=none"
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
STRIPPED_FLAGS = ("--host", "--port")
SIMULATE_ANNOTATION = "spectune.io/simulate-gpu"
TIME_SCALE_ANNOTATION = "spectune.io/simulate-time-scale"
CONTEXT_SCALE_ANNOTATION = "spectune.io/simulate-context-scale"
FIELD_REFS = {
    "metadata.name": lambda pod: pod.metadata.name,
    "metadata.namespace": lambda pod: pod.metadata.namespace,
    "status.podIP": lambda pod: pod.status.pod_ip,
    "spec.nodeName": lambda pod: pod.spec.node_name,
}

# A ready engine turns unready after this many failed probes in a row (a kubelet's default).
FAILURE_THRESHOLD = 3
PROBE_TIMEOUT = 2.0
# Never through a proxy: engines listen on loopback pod IPs only.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))

log = logging.getLogger("pod-runner")


@dataclass(frozen=True)
class EngineSpec:
    """What an engine process is started from; a change means a restart."""

    uid: str
    namespace: str
    name: str
    host: str
    port: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    pre_stop_s: float = 0.0  # the container's preStop sleep
    grace_s: float = 30.0  # the pod's terminationGracePeriodSeconds


@dataclass(frozen=True)
class Readiness:
    """What the pod's Ready condition says, and why when it is not ready."""

    ready: bool
    reason: str = ""
    message: str = ""


@dataclass
class Engine:
    """A running (or backing-off) engine process, its restart and readiness bookkeeping."""

    spec: EngineSpec
    container: str
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started_at: str = ""
    files: dict[Path, bytes] = field(default_factory=dict)
    readiness: Readiness = Readiness(False)
    failures: int = 0
    last_exit: str = ""
    waiting: str = ""  # why it has not started: the address is still another engine's


@dataclass
class Stopping:
    """An engine told to stop: SIGTERM at `term_at` (its preStop sleep over; None once sent),
    SIGKILL if it outlives its deadline."""

    proc: subprocess.Popen[bytes]
    deadline: float
    label: str
    address: tuple[str, int]
    term_at: float | None = None


class SkipPod(Exception):
    """The pod cannot be run here (no port, non-loopback IP, missing ConfigMap...)."""


def simulated_env(
    product: str | None, time_scale: float, context_scale: float = 1.0
) -> dict[str, str]:
    """The environment that runs an engine on its node's GPU, simulated (nothing off a GPU
    node)."""
    if not product:
        return {}
    env = {"SPECTUNE_SIMULATE_DEVICE": product, "SPECTUNE_SIMULATE_TIME_SCALE": f"{time_scale:g}"}
    if context_scale != 1.0:
        env["SPECTUNE_SIMULATE_CONTEXT_SCALE"] = f"{context_scale:g}"
    return env


def wants_simulation(runner_mode: bool, annotations: dict[str, str] | None) -> bool:
    """Simulated in the runner's simulated mode, or when the pod opts in by annotation (so one
    test can have GPU-shaped timing on a cluster whose runner runs everything on the CPU)."""
    return runner_mode or (annotations or {}).get(SIMULATE_ANNOTATION) == "true"


def scale_of(annotation: str, default: float, annotations: dict[str, str] | None) -> float:
    """The pod's own scale from `annotation`, else the default. The time scale: a test that
    needs many steps in little time runs faster (the modelled step times stay the SKU's; only
    the wall clock is scaled). The context scale: longer prompts weigh as long contexts do."""
    value = (annotations or {}).get(annotation)
    if value is None:
        return default
    try:
        scale = float(value)
    except ValueError:
        scale = 0.0
    if not scale > 0:
        raise SkipPod(f"annotation {annotation}={value!r} is not a positive number")
    return scale


def strip_flags(argv: list[str]) -> list[str]:
    """Drop a leading `spectune-engine`/`serve` and any --host/--port: the runner sets those."""
    if argv and Path(argv[0]).name == "spectune-engine":
        argv = argv[1:]
    if argv and argv[0] == "serve":
        argv = argv[1:]
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in STRIPPED_FLAGS:
            skip = True
            continue
        if arg.startswith(tuple(f + "=" for f in STRIPPED_FLAGS)):
            continue
        out.append(arg)
    return out


def rewrite_paths(argv: list[str], mounts: dict[str, Path]) -> list[str]:
    """Point arguments under a mount path (alone or after `--flag=`) at the runner's files."""

    def one(value: str) -> str:
        for mount, host in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value == mount:
                return str(host)
            if value.startswith(mount.rstrip("/") + "/"):
                return str(host / value[len(mount.rstrip("/")) + 1 :])
        return value

    out = []
    for arg in argv:
        if arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
            out.append(f"{flag}={one(value)}")
        else:
            out.append(one(arg))
    return out


def now_iso() -> str:
    """Now as the client library writes the times it reads, so that equal states compare equal."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def last_line(text: str) -> str:
    """The last non-empty line of a log: usually the error an engine died of."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def judge(probe_error: str | None, was: Readiness, failures: int, last_exit: str) -> Readiness:
    """A kubelet's rule: ready on the first answered probe; a ready engine turns unready after
    FAILURE_THRESHOLD failures in a row, one that is not ready yet stays so. While it has not
    been ready since it last exited, the exit says more than a refused connection."""
    if probe_error is None:
        return Readiness(True)
    if was.ready and failures < FAILURE_THRESHOLD:
        return was
    if last_exit:
        return Readiness(False, "EngineExited", last_exit)
    return Readiness(False, "EngineNotReady", f"engine not ready: {probe_error}")


def status_patch(
    status: dict[str, Any],
    container: str,
    readiness: Readiness,
    restarts: int,
    state: dict[str, Any],
    now: str,
) -> dict[str, Any] | None:
    """The pods/status strategic merge patch that makes `status` (the pod's, as the API writes
    it) say `readiness`, or None when it already does. Conditions merge by type; the container
    statuses are a whole list (atomic), so the others are carried over as they are."""
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    value = "True" if readiness.ready else "False"
    wanted = {"status": value, "reason": readiness.reason, "message": readiness.message}
    statuses = status.get("containerStatuses") or []
    mine = next((c for c in statuses if c.get("name") == container), {"name": container})
    new_mine = mine | {"ready": readiness.ready, "restartCount": restarts, "state": state}
    if new_mine == mine and all(
        {k: conditions.get(t, {}).get(k) or "" for k in wanted} == wanted
        for t in ("Ready", "ContainersReady")
    ):
        return None
    patched = []
    for type_ in ("Ready", "ContainersReady"):
        before = conditions.get(type_, {})
        since = before.get("lastTransitionTime") if before.get("status") == value else now
        patched.append(
            {
                "type": type_,
                "status": value,
                "reason": readiness.reason or None,  # null removes it
                "message": readiness.message or None,
                "lastTransitionTime": since or now,
            }
        )
    others = [c for c in statuses if c.get("name") != container]
    return {"status": {"conditions": patched, "containerStatuses": [*others, new_mine]}}


class Runner:
    """Keeps the set of engine processes equal to the set of Running engine pods."""

    def __init__(self, args: argparse.Namespace) -> None:
        config.load_kube_config(config_file=args.kubeconfig)
        self.core = client.CoreV1Api()
        self.selector: str = args.selector
        self.engine: str = args.engine
        self.state_dir = Path(args.state_dir).resolve()
        self.log_dir = Path(args.log_dir).resolve()
        self.stop_timeout: float = args.stop_timeout
        self.simulate: bool = args.simulate_gpus
        self.time_scale: float = args.simulate_time_scale
        self.engines: dict[str, Engine] = {}
        self.stopping: list[Stopping] = []
        self.base_env = dict(os.environ)
        self.base_env.setdefault("SPECTUNE_CACHE", str(REPO / ".cache" / "models"))
        # Many engines share a small machine; a pod can raise this through its env.
        self.base_env.setdefault("OMP_NUM_THREADS", "1")
        # The fake GPU nodes have no device behind them: engines that hold nvidia.com/gpu (and
        # so ask for CUDA) run on this machine's CPU; a pod's own env overrides it.
        self.base_env.setdefault("SPECTUNE_DEVICE", "cpu")

    # --- reading pods -----------------------------------------------------------------------

    def read_object_data(self, kind: str, namespace: str, name: str) -> dict[str, bytes]:
        """The data of a ConfigMap or Secret as bytes by key."""
        if kind == "configMap":
            cm = self.core.read_namespaced_config_map(name, namespace)
            data = {k: v.encode() for k, v in (cm.data or {}).items()}
            data |= {k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()}
            return data
        secret = self.core.read_namespaced_secret(name, namespace)
        return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    def volume_files(self, pod: Any, container: Any) -> tuple[dict[str, Path], dict[Path, bytes]]:
        """Mount path -> host path, and host file -> content, for ConfigMap/Secret volumes."""
        meta = pod.metadata
        pod_dir = self.state_dir / meta.namespace / f"{meta.name}-{meta.uid[:8]}"
        volumes = {v.name: v for v in pod.spec.volumes or []}
        mounts: dict[str, Path] = {}
        files: dict[Path, bytes] = {}
        for mount in container.volume_mounts or []:
            vol = volumes.get(mount.name)
            if vol is None:
                continue
            if vol.config_map is not None:
                kind, source = "configMap", vol.config_map
                obj_name = source.name
            elif vol.secret is not None:
                kind, source = "secret", vol.secret
                obj_name = source.secret_name
            else:
                host = self.host_dir(pod.metadata.namespace, vol)
                if host is not None:
                    mounts[mount.mount_path] = host / mount.sub_path if mount.sub_path else host
                continue
            try:
                data = self.read_object_data(kind, pod.metadata.namespace, obj_name)
            except ApiException as e:
                if e.status == 404 and source.optional:
                    data = {}
                else:
                    raise SkipPod(f"{kind} {obj_name}: {e.reason}") from e
            if source.items:
                data = {item.path: data[item.key] for item in source.items if item.key in data}
            vol_dir = pod_dir / mount.name
            for key, content in data.items():
                files[vol_dir / key] = content
            mounts[mount.mount_path] = vol_dir / mount.sub_path if mount.sub_path else vol_dir
        return mounts, files

    def host_dir(self, namespace: str, volume: Any) -> Path | None:
        """The directory of this machine a hostPath volume, or a claim bound to a hostPath or
        local PersistentVolume, stands for; None for other volumes (not mapped)."""
        if volume.host_path is not None:
            return Path(volume.host_path.path)
        if volume.persistent_volume_claim is None:
            return None
        claim_name = volume.persistent_volume_claim.claim_name
        try:
            claim = self.core.read_namespaced_persistent_volume_claim(claim_name, namespace)
        except ApiException as e:
            raise SkipPod(f"claim {claim_name}: {e.reason}") from e
        if not claim.spec.volume_name:
            raise SkipPod(f"claim {claim_name} is not bound to a volume yet")
        pv = self.core.read_persistent_volume(claim.spec.volume_name)
        source = pv.spec.host_path or pv.spec.local
        if source is None:
            raise SkipPod(f"volume {pv.metadata.name} is neither hostPath nor local")
        return Path(source.path)

    def env_of(self, pod: Any, container: Any) -> dict[str, str]:
        """The container's env as the kubelet would resolve it, for the cases engines use."""
        env: dict[str, str] = {}
        for var in container.env or []:
            if var.value is not None:
                env[var.name] = var.value
                continue
            src = var.value_from
            if src is None:
                env[var.name] = ""
            elif src.field_ref is not None and src.field_ref.field_path in FIELD_REFS:
                env[var.name] = FIELD_REFS[src.field_ref.field_path](pod) or ""
            elif src.config_map_key_ref is not None or src.secret_key_ref is not None:
                ref = src.config_map_key_ref or src.secret_key_ref
                kind = "configMap" if src.config_map_key_ref is not None else "secret"
                try:
                    data = self.read_object_data(kind, pod.metadata.namespace, ref.name)
                except ApiException as e:
                    if ref.optional:
                        continue
                    raise SkipPod(f"{kind} {ref.name}: {e.reason}") from e
                if ref.key in data:
                    env[var.name] = data[ref.key].decode()
                elif not ref.optional:
                    raise SkipPod(f"{kind} {ref.name} has no key {ref.key}")
        return env

    def spec_of(self, pod: Any) -> tuple[EngineSpec, dict[Path, bytes], str]:
        """The engine a Running pod asks for, the volume files it needs, its container's name."""
        ip = pod.status.pod_ip
        if ipaddress.ip_address(ip) not in LOOPBACK:
            raise SkipPod(f"pod IP {ip} is not loopback; refusing to serve on it")
        containers = pod.spec.containers
        container = next((c for c in containers if c.name == "engine"), containers[0])
        ports = [p for p in container.ports or [] if (p.protocol or "TCP") == "TCP"]
        port = next((p for p in ports if p.name == "http"), ports[0] if ports else None)
        if port is None:
            raise SkipPod(f"container {container.name} declares no TCP containerPort")
        mounts, files = self.volume_files(pod, container)
        argv = strip_flags(list(container.command or []) + list(container.args or []))
        argv = rewrite_paths(argv, mounts)
        full = (self.engine, "serve", *argv, "--host", ip, "--port", str(port.container_port))
        grace = pod.spec.termination_grace_period_seconds
        grace = 30.0 if grace is None else float(grace)
        pre_stop = container.lifecycle.pre_stop if container.lifecycle else None
        sleep = pre_stop.sleep.seconds if pre_stop is not None and pre_stop.sleep else 0
        spec = EngineSpec(
            uid=pod.metadata.uid,
            namespace=pod.metadata.namespace,
            name=pod.metadata.name,
            host=ip,
            port=port.container_port,
            argv=full,
            env=tuple(sorted((self.gpu_env(pod) | self.env_of(pod, container)).items())),
            pre_stop_s=min(float(sleep), grace),
            grace_s=grace,
        )
        return spec, files, container.name

    def gpu_env(self, pod: Any) -> dict[str, str]:
        if not wants_simulation(self.simulate, pod.metadata.annotations) or not pod.spec.node_name:
            return {}
        labels = self.core.read_node(pod.spec.node_name).metadata.labels or {}
        annotations = pod.metadata.annotations
        return simulated_env(
            labels.get("nvidia.com/gpu.product"),
            scale_of(TIME_SCALE_ANNOTATION, self.time_scale, annotations),
            scale_of(CONTEXT_SCALE_ANNOTATION, 1.0, annotations),
        )

    def wanted(self) -> dict[str, tuple[EngineSpec, dict[Path, bytes], str, dict[str, Any]]]:
        """Engines that should run now, by pod UID, with their pod's status as the API has it."""
        pods = self.core.list_pod_for_all_namespaces(label_selector=self.selector).items
        out = {}
        for pod in pods:
            if (
                pod.metadata.deletion_timestamp is not None
                or pod.status.phase != "Running"
                or not pod.status.pod_ip
            ):
                continue
            try:
                status = self.core.api_client.sanitize_for_serialization(pod.status)
                out[pod.metadata.uid] = (*self.spec_of(pod), status)
            except SkipPod as e:
                log.warning("not running %s/%s: %s", pod.metadata.namespace, pod.metadata.name, e)
        return out

    # --- processes --------------------------------------------------------------------------

    @staticmethod
    def write_files(files: dict[Path, bytes]) -> None:
        """Write volume files atomically, so an engine watching its config never reads half."""
        for path, content in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(content)
            tmp.replace(path)

    def start(self, engine: Engine) -> None:
        """Start (or restart) one engine, logging to its own file."""
        spec = engine.spec
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_file = self.log_dir / f"{spec.namespace}_{spec.name}.log"
        env = self.base_env | dict(spec.env)
        with log_file.open("ab") as out:
            out.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(spec.argv)}\n".encode())
            out.flush()
            engine.proc = subprocess.Popen(
                spec.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=REPO,
            )  # fmt: skip
        engine.started_at = now_iso()
        engine.failures = 0
        log.info(
            "started engine for %s/%s on %s:%d (pid %d)",
            spec.namespace, spec.name, spec.host, spec.port, engine.proc.pid,
        )  # fmt: skip

    def stop(self, engine: Engine, why: str, graceful: bool = True) -> None:
        """Ask an engine to drain and stop, as a kubelet would (`graceful`): after its preStop
        sleep, within its grace period; else SIGTERM now, killed after --stop-timeout. reap()
        sends what is due."""
        proc, spec = engine.proc, engine.spec
        engine.proc = None
        if proc is None or proc.poll() is not None:
            return
        now = time.monotonic()
        pre_stop = spec.pre_stop_s if graceful else 0.0
        deadline = now + (spec.grace_s if graceful else self.stop_timeout)
        log.info(
            "stopping engine for %s/%s (%s)%s", spec.namespace, spec.name, why,
            f" after its {pre_stop:.0f} s preStop sleep" if pre_stop else "",
        )  # fmt: skip
        label = f"{spec.namespace}/{spec.name}"
        stopping = Stopping(proc, deadline, label, (spec.host, spec.port), now + pre_stop)
        self.stopping.append(stopping)
        self.reap()

    def reap(self) -> None:
        """Forget engines that have stopped; SIGTERM those whose preStop is over; kill those
        past their deadline."""
        left = []
        now = time.monotonic()
        for s in self.stopping:
            if s.proc.poll() is not None:
                continue
            if now > s.deadline:
                log.warning("killing engine for %s: it did not stop in time", s.label)
                s.proc.kill()
                s.proc.wait()
                continue
            if s.term_at is not None and now >= s.term_at:
                with contextlib.suppress(ProcessLookupError):
                    s.proc.send_signal(signal.SIGTERM)
                s.term_at = None
            left.append(s)
        self.stopping = left

    def held(self, spec: EngineSpec) -> bool:
        """Whether an engine still stopping listens on this engine's address."""
        return any(s.address == (spec.host, spec.port) for s in self.stopping)

    def sync(self) -> None:
        """One pass: start, restart, update and stop engines to match the pods, and write back
        whether each is ready."""
        wanted = self.wanted()
        for uid in list(self.engines):
            if uid not in wanted:
                self.stop(self.engines.pop(uid), "pod gone")
        now = time.monotonic()
        for uid, (spec, files, container, status) in wanted.items():
            engine = self.engines.get(uid)
            if engine is not None and engine.spec != spec:
                self.stop(self.engines.pop(uid), "pod spec changed")
                engine = None
            if engine is None:
                engine = self.engines[uid] = Engine(spec, container)
            if files != engine.files:
                self.write_files(files)
                engine.files = files
            if engine.proc is not None and (code := engine.proc.poll()) is not None:
                self.exited(engine, code, now)
            engine.waiting = ""
            if engine.proc is None and self.held(spec):
                engine.waiting = f"{spec.host}:{spec.port} is still a stopping engine's"
            elif engine.proc is None and now >= engine.next_start:
                self.start(engine)
            self.report(engine, status)
        self.reap()

    def exited(self, engine: Engine, code: int, now: float) -> None:
        """Book an engine's exit: back off before the restart, and say why it is down."""
        spec = engine.spec
        engine.proc = None
        engine.restarts += 1
        delay = min(2.0 ** min(engine.restarts, 5), 30.0)
        engine.next_start = now + delay
        log_file = self.log_dir / f"{spec.namespace}_{spec.name}.log"
        tail = last_line(log_file.read_text(errors="replace")) if log_file.exists() else ""
        engine.last_exit = f"engine exited with code {code}" + (f": {tail[:300]}" if tail else "")
        engine.readiness = Readiness(False, "EngineExited", engine.last_exit)
        log.warning(
            "engine for %s/%s exited with %s; restart %d in %.0f s",
            spec.namespace, spec.name, code, engine.restarts, delay,
        )  # fmt: skip

    def probe(self, engine: Engine) -> str | None:
        """GET /readyz on the engine: None when it answers 200, else what went wrong."""
        url = f"http://{engine.spec.host}:{engine.spec.port}/readyz"
        try:
            with HTTP.open(url, timeout=PROBE_TIMEOUT) as r:
                return None if r.status == 200 else f"GET /readyz answered {r.status}"
        except urllib.error.HTTPError as e:
            e.close()
            return f"GET /readyz answered {e.code}"
        except OSError as e:
            return f"GET /readyz: {getattr(e, 'reason', e)}"

    def report(self, engine: Engine, status: dict[str, Any]) -> None:
        """Probe a running engine and write its readiness into the pod's status if it moved."""
        if engine.proc is not None:
            error = self.probe(engine)
            engine.failures = 0 if error is None else engine.failures + 1
            engine.readiness = judge(error, engine.readiness, engine.failures, engine.last_exit)
            if engine.readiness.ready:
                engine.last_exit = ""
            state = {"running": {"startedAt": engine.started_at}}
        elif engine.waiting:
            engine.readiness = Readiness(False, "ContainerCreating", engine.waiting)
            state = {"waiting": {"reason": "ContainerCreating", "message": engine.waiting}}
        else:
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": engine.last_exit}}
        patch = status_patch(
            status, engine.container, engine.readiness, engine.restarts, state, now_iso()
        )
        if patch is None:
            return
        spec = engine.spec
        try:
            self.core.patch_namespaced_pod_status(
                spec.name, spec.namespace, patch,
                _content_type="application/strategic-merge-patch+json",
            )  # fmt: skip
        except ApiException as e:  # the pod went away meanwhile: the next pass stops its engine
            log.warning("pod %s/%s: status not written: %s", spec.namespace, spec.name, e.reason)
            return
        log.info(
            "pod %s/%s %s%s", spec.namespace, spec.name,
            "ready" if engine.readiness.ready else "not ready",
            f": {engine.readiness.message}" if engine.readiness.message else "",
        )  # fmt: skip

    def shutdown(self) -> None:
        """Stop every engine and wait for them (bounded by the stop timeout)."""
        for uid in list(self.engines):
            self.stop(self.engines.pop(uid), "runner stopping", graceful=False)
        while self.stopping:
            self.reap()
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=str(REPO / ".local" / "kubeconfig"))
    parser.add_argument("--selector", default=DEFAULT_SELECTOR, help="label selector of pods")
    parser.add_argument("--engine", default=str(REPO / ".venv" / "bin" / "spectune-engine"))
    parser.add_argument("--state-dir", default=str(REPO / ".local" / "state" / "pods"))
    parser.add_argument("--log-dir", default=str(REPO / ".local" / "logs" / "pods"))
    parser.add_argument("--ready-file", help="touched after the first successful pass")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes")
    parser.add_argument("--stop-timeout", type=float, default=15.0)
    parser.add_argument(
        "--simulate-gpus",
        action="store_true",
        default=os.environ.get("SPECTUNE_SIMULATE_GPUS") == "1",
        help="run engines on their node's GPU SKU, simulated (env SPECTUNE_SIMULATE_GPUS=1)",
    )
    parser.add_argument(
        "--simulate-time-scale",
        type=float,
        default=float(os.environ.get("SPECTUNE_SIMULATE_TIME_SCALE", "16")),
        help="simulated engines' clock runs this many times slower than the SKU (default 16)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    runner = Runner(args)
    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ready = False
    while not stop:
        try:
            runner.sync()
        except Exception as e:  # the API server restarting must not take the engines down
            log.warning("pass failed: %s", e)
        else:
            if not ready and args.ready_file:
                Path(args.ready_file).touch()
            ready = True
        deadline = time.monotonic() + args.interval
        while not stop and time.monotonic() < deadline:
            time.sleep(0.05)
    runner.shutdown()
    if args.ready_file:
        Path(args.ready_file).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
