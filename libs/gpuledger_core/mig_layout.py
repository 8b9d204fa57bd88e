"""Which MIG layouts fit a card, by the rules NVIDIA's MIG User Guide gives, over the tables of
``mig_profiles``: where the driver puts a GPU instance when not told, and the ID it gets.

A GPU instance occupies the memory slices its placement names (``[start, start + size)``); two
instances may not share a memory slice; at most ``instances`` of a profile exist at once; and the
media engines of all instances together are no more than the whole-card profile has (so only one
``+me`` instance, and on the A30 not a 1g+me beside a 2g+me). Nothing else: compute slices follow
from the placements (a 3g and a 4g both take half of the memory slices).

``choose`` is where ``nvmlDeviceCreateGpuInstance`` puts an instance when no placement is given: the
free placement that blocks the fewest placements still free (of every profile), the lowest start
on a tie. NVIDIA does not document the rule; this one reproduces every creation the guide shows
(``-cgi 9,19,14,19``; ``-cgi 14,19,19,19,19,19``; ``-cgi 19,19,14,9`` failing on its 3g.20gb; the
two 3g.20gb of ``-cgi 9,3g.20gb``, created as IDs 2 then 1), and an A30's published ``-cgi 14``,
``14``, ``5``. GPU instance IDs follow the placement as a binary tree over the memory slices (the
whole card 0, its halves 1 and 2, quarters 3-6, eighths 7-14; on the A30: 0, 1-2, 3-6), as every
listing in the guide shows but the ``-lgi`` of its first example, which names the two 3g.20gb the
other way round.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger_core.mig_profiles import GiProfile, MigModel

Placed = tuple[GiProfile, int]  # a profile at a start (in memory slices)


class LayoutError(ValueError):
    """A layout that does not fit the card; the message names the profile that found no room."""


def overlaps(a: Placed, b: Placed) -> bool:
    (pa, sa), (pb, sb) = a, b
    return sa < sb + pb.memory_slices and sb < sa + pa.memory_slices


def free_starts(profile: GiProfile, placed: Sequence[Placed]) -> list[int]:
    """The profile's starts whose memory slices no placed instance occupies."""
    return [s for s in profile.starts if not any(overlaps((profile, s), p) for p in placed)]


def _engines_left(model: MigModel, placed: Sequence[Placed]) -> tuple[int, int, int]:
    whole = model.whole
    used = [(p.decoders, p.jpegs, p.ofas) for p, _ in placed]
    return (
        whole.decoders - sum(u[0] for u in used),
        whole.jpegs - sum(u[1] for u in used),
        whole.ofas - sum(u[2] for u in used),
    )


def _more_allowed(model: MigModel, profile: GiProfile, placed: Sequence[Placed]) -> int:
    """How many more the instance count and the media engines allow, placements aside."""
    left = [profile.instances - sum(1 for p, _ in placed if p.id == profile.id)]
    need = (profile.decoders, profile.jpegs, profile.ofas)
    left += [have // n for have, n in zip(_engines_left(model, placed), need, strict=True) if n]
    return max(0, min(left))


def fits_at(model: MigModel, profile: GiProfile, start: int, placed: Sequence[Placed]) -> bool:
    return start in free_starts(profile, placed) and _more_allowed(model, profile, placed) > 0


def _blocked(model: MigModel, new: Placed, placed: Sequence[Placed]) -> int:
    """How many placements, of every profile, still free now would the new instance block."""
    return sum(1 for p in model.profiles for s in free_starts(p, placed) if overlaps((p, s), new))


def choose(model: MigModel, profile: GiProfile, placed: Sequence[Placed]) -> int | None:
    """Where NVML puts a new instance of the profile when not told; None: it does not fit."""
    if _more_allowed(model, profile, placed) == 0:
        return None
    starts = free_starts(profile, placed)
    if not starts:
        return None
    return min(starts, key=lambda s: (_blocked(model, (profile, s), placed), s))


def remaining(model: MigModel, profile: GiProfile, placed: Sequence[Placed]) -> int:
    """How many more instances of the profile could still be created, as
    ``nvmlDeviceGetGpuInstanceRemainingCapacity`` counts them."""
    taken: list[Placed] = list(placed)
    room = 0
    for start in free_starts(profile, placed):
        if not any(overlaps((profile, start), p) for p in taken):
            taken.append((profile, start))
            room += 1
    return min(room, _more_allowed(model, profile, placed))


def gpu_instance_id(model: MigModel, profile: GiProfile, start: int) -> int:
    """The GPU instance ID of a placement: its node in the binary tree over the memory slices."""
    per_level = model.memory_slices // profile.memory_slices
    return per_level - 1 + start // profile.memory_slices


def place_all(model: MigModel, profiles: Sequence[GiProfile]) -> list[int]:
    """The starts of a whole layout, created largest first as an operator's tool would (so the
    order the layout is written in does not matter); raises ``LayoutError`` where it does not fit."""
    order = sorted(range(len(profiles)), key=lambda i: -profiles[i].memory_slices)
    placed: list[Placed] = []
    starts = [0] * len(profiles)
    for i in order:
        start = choose(model, profiles[i], placed)
        if start is None:
            beside = ", ".join(p.name for p, _ in placed) or "nothing"
            raise LayoutError(f"{profiles[i].name} does not fit beside {beside} on {model.name}")
        placed.append((profiles[i], start))
        starts[i] = start
    return starts
