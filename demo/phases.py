"""The demo's story as data: what the fleet and the traffic are in each phase, and which of the
operator's triggers the phase should set off. The driver (run.py) makes each phase true on the
cluster and waits for the operator's reaction; nothing here talks to a cluster."""

from __future__ import annotations

from dataclasses import dataclass

A100 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"


@dataclass(frozen=True)
class Phase:
    name: str
    title: str  # what changed, as the live view and the report say it
    sku: str  # the nodeSelector's nvidia.com/gpu.product
    replicas: int
    clients: tuple[int, ...]  # closed-loop clients over all pods, a level every LEVEL_SECONDS
    temperature: float  # of every request: higher samples further from what n-gram drafts
    trigger: str  # the calibration trigger the phase should cause (status.calibration.trigger)
    max_seconds: float  # give up waiting for the operator's reaction after this long

    def clients_at(self, seconds: float) -> int:
        """Busy traffic comes in waves: the levels take turns, so every batch bucket between
        them gets measured, the ones around the crossover included."""
        return self.clients[int(seconds // LEVEL_SECONDS) % len(self.clients)]


LEVEL_SECONDS = 10.0


# n-gram lookup, k=16, sampled requests (temperature 1.0): n-gram lookup's drafts are mostly
# rejected, so on an A100 speculation stops paying near a batch of 36, which this machine's load
# reaches; an H100 has more compute per byte of bandwidth, so there it pays up to about 55.
# Busy traffic comes in waves of levels either side of the crossover. Scaling out spreads the
# same traffic over two engines, and neither's batch reaches the crossover any more. On the
# H100s the requests are sampled cooler (0.7: more drafts accepted), so the crossover moves
# well past the A100's, not to the next bucket, where the dead band rightly holds it (at 1.0
# it landed at 58-64, one bucket from the A100's 38); sampling hotter (1.5) then brings it down.
BUSY, DOUBLED = (24, 44, 64), (48, 88, 128)
STORY = (
    Phase("quiet", "quiet: a few clients", A100, 1, (3,), 1.0, "Initial", 360),
    Phase("busy", "busy: the batch passes the crossover", A100, 1, BUSY, 1.0, "Traffic", 360),
    Phase("scaled", "scaled out to 2 replicas", A100, 2, BUSY, 1.0, "Replicas", 360),
    Phase(
        "moved",
        "moved to H100 nodes, traffic doubled, sampled cooler",
        H100,
        2,
        DOUBLED,
        0.7,
        "Sku",
        360,
    ),
    Phase(
        "shifted", "sampled hotter: fewer drafts accepted", H100, 2, DOUBLED, 1.5, "Traffic", 360
    ),
)
