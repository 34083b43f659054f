"""How far a draft model's KV lags behind the committed tokens, and what catching it up owes.

The draft's cache lags after a prefill and while speculation is off (a gated-off iteration
never touches the draft), so the first spec iteration after that catches up in a forward of
its own. Torch-free: the engine's `ModelDrafter` runs that forward on the draft model, the
fleet simulator charges it to a simulated device, and both keep the books here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spectune.engine.sequence import Sequence

# In steady speculation the draft has seen all but the newest one or two committed tokens
# (the newest is fed with the first draft token; an accepted k-th draft never was).
STEADY_LAG = 2


@dataclass(frozen=True)
class CatchUp:
    """What one catch-up forward read: `owed` tokens speculation would have had to read
    anyway (the draft's prefill of what the target prefilled, and what a paused sequence
    skipped), `missed` tokens only because plain iterations committed them.

    The forward's measured time is split between them by token count rather than by running
    two forwards: one forward keeps the draft's computation (its KV, hence its drafts)
    exactly as it was, and a second would add a fixed cost (launches, a pass over the
    weights) that exists only to be measured. Missed tokens sit at later positions and so
    attend to a little more context each: the split charges the owed share slightly high.
    That fixed cost is owed whole, though, whenever a token is: steady speculation runs a
    forward of its own for a paused sequence's skipped tokens or a prompt, and one that feeds
    few tokens costs about what any draft forward does (`split`'s floor).
    """

    owed: int = 0
    missed: int = 0

    @property
    def fed(self) -> int:
        return self.owed + self.missed

    def split(self, seconds: float, floor: float = 0.0) -> tuple[float, float]:
        """(owed, missed) shares of the forward's `seconds`: by token count, the owed share at
        least `floor` (the time of one of the iteration's own draft forwards) when any token is
        owed. By count alone, a calibration's 50% booked a third of the draft's prefill seconds
        as catch-up on a simulated L4, and its speedups read 0.3-0.9% higher for it
        (docs/PERFORMANCE.md, "The catch-up's fixed cost")."""
        if not self.fed:
            return 0.0, 0.0
        owed = min(seconds, max(seconds * self.owed / self.fed, floor)) if self.owed else 0.0
        return owed, seconds - owed


def owed(length: int, draft_cached: int, plain_unread: int) -> int:
    """Of the tokens a catch-up feeds a sequence of `length` tokens (a Sequence's fields, as
    the fleet simulator may hold them apart from it), those it would feed had no plain
    iteration run: with them uncommitted the lag is shorter by `plain_unread`, and within the
    steady lag the first drafting forward reads it at no forward of its own."""
    without = length - 1 - draft_cached - plain_unread
    return without if without >= STEADY_LAG else 0


def catch_up(seqs: list[Sequence], read: Callable[[list[Sequence]], None]) -> CatchUp:
    """Bring the draft of every sequence that lags beyond the steady state up to all but the
    newest token (left for the first drafting forward). `read(behind)` runs the one forward
    over each one's `token_ids[draft_cached:-1]` before the books move. Nothing fed: none
    missed."""
    behind = [s for s in seqs if len(s) - s.draft_cached > STEADY_LAG]
    if not behind:
        return CatchUp()
    read(behind)
    fed = sum(len(s) - 1 - s.draft_cached for s in behind)
    owing = sum(owed(len(s), s.draft_cached, s.plain_unread) for s in behind)
    for s in behind:
        s.draft_cached = len(s) - 1
    return CatchUp(owing, fed - owing)
