"""The MIG profiles each card model offers, as NVIDIA documents them: per GPU instance profile its
NVML profile index and ID, compute and memory slices, memory, SMs, copy engines and media engines,
how many may exist at once, and where it may be placed.

Sources, all from NVIDIA's *Multi-Instance GPU User Guide* (R580 edition, docs.nvidia.com/datacenter/
tesla/mig-user-guide), unless a row says otherwise:

- the fractions, engines, copy engines and instance counts: "Supported MIG Profiles", the tables
  *GPU Instance Profiles on A30*, *on A100* (A100-SXM4-40GB; the guide says the 80 GB card has the
  same profiles under other names), *on H100* (H100 80 GB) and *on H200*;
- profile IDs, memory (GiB, to two places, times 1024) and SM counts of the A100 40 GB: the guide's
  ``nvidia-smi mig -lgip`` listing ("List GPU Instance Profiles");
- placements: the guide's ``nvidia-smi mig -lgipp`` listing (A100; the same listing is printed for
  H100 and H100 NVL cards elsewhere) and the placement figures ("Profile Placements on A100",
  "Profiles on A30"): a placement is a start and a size in *memory* slices (8 on the 7-slice cards,
  4 on the A30), which is why a 3g and a 4g both take half the card;
- the H100's 3g.40gb (40448 MiB, 60 SMs, 3 CE/DEC/JPEG): the guide's MPS example on an H100 80GB.

Where the guide is silent, and what was taken instead:

- H100 80 GB memory and SMs of the other profiles: an ``nvidia-smi mig -lgip`` listing of an H100 80GB
  HBM3 published outside NVIDIA. It gives the 1g.20gb 26 SMs; the guide gives it 1/7 of the SMs, like
  the 1g.10gb, so the table keeps the 1g.10gb's 16 (the guide wins where the two disagree).
- A30 profile IDs, memory and SMs: an ``nvidia-smi mig -lgip``/``-lgipp`` listing of an A30 (R535). That
  listing shows one decoder on the 1g.6gb; the guide says none, and the table says none.
- A100 80 GB memory: the guide gives none; the values are this fake's earlier ones (each about twice
  the 40 GB card's). Its SMs are the 40 GB card's (the same GA100 configuration).
- H200 memory: the guide gives none; the table takes each name's GB times 1024, an approximation.
  Its SMs and engines are the H100's (the same GH100, the same fractions in the guide).

NVIDIA's go-nvml mock of these cards (pkg/nvml/mock/shared/gpus) disagrees with the guide in places:
it gives the 1g.5gb a decoder, places the 1g.10gb at every slot with size 1 and the 3g with size 3,
and gives the H200's 7g 112 SMs. The table follows the guide.

Newer drivers add ``-me``, ``+me.all`` and ``+gfx`` profiles (Blackwell, some Hopper drivers); they are
not modelled here, nor are the H100 94/96 GB cards (any H100 gets the 80 GB table).
"""

from __future__ import annotations

from dataclasses import dataclass

# NVML's profile indexes (``NVML_GPU_INSTANCE_PROFILE_*`` in nvml.h and pynvml), written out: the
# core imports no NVML binding. The fake NVML's tests check them against pynvml's constants.
_P1, _P2, _P3, _P4, _P7 = 0, 1, 2, 3, 4  # ..._1_SLICE, _2_SLICE, _3_SLICE, _4_SLICE, _7_SLICE
_P1_ME = 7  # NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: 1g+me
_P2_ME = 8  # NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1: 2g+me (A30)
_P1_BIG = 9  # NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: 1g with two memory slices


@dataclass(frozen=True, slots=True)
class GiProfile:
    """One GPU instance profile of one card model, as ``nvmlDeviceGetGpuInstanceProfileInfo``
    reports it, with the placements ``nvmlDeviceGetGpuInstancePossiblePlacements`` lists."""

    name: str  # "1g.5gb": NVML's name is "MIG " + this
    index: int  # NVML_GPU_INSTANCE_PROFILE_*: what the profile-info call takes
    id: int  # the profile ID NVML reports and the create calls take
    slices: int  # compute (SM) slices: sliceCount
    memory_slices: int  # a placement's size
    memory_mib: int  # memorySizeMB
    multiprocessors: int
    copy_engines: int
    decoders: int
    jpegs: int
    ofas: int
    instances: int  # at most this many at once: instanceCount
    starts: tuple[int, ...]  # a placement's possible starts, in memory slices
    encoders: int = 0  # none of these cards has an encoder in a MIG instance


@dataclass(frozen=True, slots=True)
class MigModel:
    """A card model's MIG: its memory slices, how many MIG devices it can have, its profiles."""

    name: str
    memory_slices: int
    max_devices: int
    profiles: tuple[GiProfile, ...]

    def by_name(self, name: str) -> GiProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def by_index(self, index: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.index == index), None)

    def by_id(self, profile_id: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)

    @property
    def whole(self) -> GiProfile:
        """The profile that takes the whole card: its engines are all the card has."""
        return next(p for p in self.profiles if p.memory_slices == self.memory_slices)


_ANY7 = (0, 1, 2, 3, 4, 5, 6)
_PAIRS = (0, 2, 4, 6)
_TRIO = (0, 2, 4)
_HALVES = (0, 4)
_FIRST = (0,)


def _row(
    name: str,
    index: int,
    profile_id: int,
    slices: tuple[int, int],
    memory_mib: int,
    sms: int,
    engines: tuple[int, int, int, int],
    instances: int,
    starts: tuple[int, ...],
) -> GiProfile:
    """``slices`` is (compute, memory); ``engines`` is (copy engines, decoders, JPEG, OFA)."""
    ce, dec, jpeg, ofa = engines
    return GiProfile(name, index, profile_id, *slices, memory_mib, sms, ce, dec, jpeg, ofa, instances, starts)


# fmt: off
# name, index, ID, (compute, memory slices), MiB, SMs, (CE, DEC, JPEG, OFA), at most, starts
A100_40GB = MigModel("A100-SXM4-40GB", 8, 7, (
    _row("1g.5gb",     _P1,     19, (1, 1),  4864, 14, (1, 0, 0, 0), 7, _ANY7),
    _row("1g.5gb+me",  _P1_ME,  20, (1, 1),  4864, 14, (1, 1, 1, 1), 1, _ANY7),
    # The guide's table says 1/8 of the memory; its placements ({0,2,4,6}:2) and its name say 2/8.
    _row("1g.10gb",    _P1_BIG, 15, (1, 2),  9856, 14, (1, 1, 0, 0), 4, _PAIRS),
    _row("2g.10gb",    _P2,     14, (2, 2),  9856, 28, (2, 1, 0, 0), 3, _TRIO),
    _row("3g.20gb",    _P3,      9, (3, 4), 19968, 42, (3, 2, 0, 0), 2, _HALVES),
    _row("4g.20gb",    _P4,      5, (4, 4), 19968, 56, (4, 2, 0, 0), 1, _FIRST),
    _row("7g.40gb",    _P7,      0, (7, 8), 40192, 98, (7, 5, 1, 1), 1, _FIRST),
))
A100_80GB = MigModel("A100-SXM4-80GB", 8, 7, (
    _row("1g.10gb",    _P1,     19, (1, 1),  9728, 14, (1, 0, 0, 0), 7, _ANY7),
    _row("1g.10gb+me", _P1_ME,  20, (1, 1),  9728, 14, (1, 1, 1, 1), 1, _ANY7),
    _row("1g.20gb",    _P1_BIG, 15, (1, 2), 19968, 14, (1, 1, 0, 0), 4, _PAIRS),
    _row("2g.20gb",    _P2,     14, (2, 2), 19968, 28, (2, 1, 0, 0), 3, _TRIO),
    _row("3g.40gb",    _P3,      9, (3, 4), 40192, 42, (3, 2, 0, 0), 2, _HALVES),
    _row("4g.40gb",    _P4,      5, (4, 4), 40192, 56, (4, 2, 0, 0), 1, _FIRST),
    _row("7g.80gb",    _P7,      0, (7, 8), 80384, 98, (7, 5, 1, 1), 1, _FIRST),
))
A30_24GB = MigModel("A30-24GB", 4, 4, (
    _row("1g.6gb",     _P1,     14, (1, 1),  5952, 14, (1, 0, 0, 0), 4, (0, 1, 2, 3)),
    _row("1g.6gb+me",  _P1_ME,  21, (1, 1),  5952, 14, (1, 1, 1, 1), 1, (0, 1, 2, 3)),
    _row("2g.12gb",    _P2,      5, (2, 2), 11968, 28, (2, 2, 0, 0), 2, (0, 2)),
    _row("2g.12gb+me", _P2_ME,   6, (2, 2), 11968, 28, (2, 2, 1, 1), 1, (0, 2)),
    _row("4g.24gb",    _P4,      0, (4, 4), 24000, 56, (4, 4, 1, 1), 1, _FIRST),
))
H100_80GB = MigModel("H100-80GB", 8, 7, (
    _row("1g.10gb",    _P1,     19, (1, 1),  9984,  16, (1, 1, 1, 0), 7, _ANY7),
    _row("1g.10gb+me", _P1_ME,  20, (1, 1),  9984,  16, (1, 1, 1, 1), 1, _ANY7),
    _row("1g.20gb",    _P1_BIG, 15, (1, 2), 20096,  16, (1, 1, 1, 0), 4, _PAIRS),
    _row("2g.20gb",    _P2,     14, (2, 2), 20096,  32, (2, 2, 2, 0), 3, _TRIO),
    _row("3g.40gb",    _P3,      9, (3, 4), 40448,  60, (3, 3, 3, 0), 2, _HALVES),
    _row("4g.40gb",    _P4,      5, (4, 4), 40448,  64, (4, 4, 4, 0), 1, _FIRST),
    _row("7g.80gb",    _P7,      0, (7, 8), 81152, 132, (8, 7, 7, 1), 1, _FIRST),
))
H200_141GB = MigModel("H200-141GB", 8, 7, (
    _row("1g.18gb",    _P1,     19, (1, 1),  18432,  16, (1, 1, 1, 0), 7, _ANY7),
    _row("1g.18gb+me", _P1_ME,  20, (1, 1),  18432,  16, (1, 1, 1, 1), 1, _ANY7),
    _row("1g.35gb",    _P1_BIG, 15, (1, 2),  35840,  16, (1, 1, 1, 0), 4, _PAIRS),
    _row("2g.35gb",    _P2,     14, (2, 2),  35840,  32, (2, 2, 2, 0), 3, _TRIO),
    _row("3g.71gb",    _P3,      9, (3, 4),  72704,  60, (3, 3, 3, 0), 2, _HALVES),
    _row("4g.71gb",    _P4,      5, (4, 4),  72704,  64, (4, 4, 4, 0), 1, _FIRST),
    _row("7g.141gb",   _P7,      0, (7, 8), 144384, 132, (8, 7, 7, 1), 1, _FIRST),
))
# fmt: on

MODELS = (A100_40GB, A100_80GB, A30_24GB, H100_80GB, H200_141GB)


def mig_model(model: str, memory_mib: int) -> MigModel | None:
    """The MIG table of a card by its NVML name and memory, or None for a card without MIG."""
    if "A30" in model:
        return A30_24GB
    if "A100" in model:
        return A100_40GB if memory_mib <= 49152 else A100_80GB
    if "H200" in model:
        return H200_141GB
    if "H100" in model or "H800" in model:
        return H100_80GB
    return None


def default_layout(model: MigModel) -> tuple[GiProfile, ...]:
    """A mixed layout for profiles that turn MIG on without naming one: 3g + 2g + 1g + 1g on the
    7-slice cards, 2g + 1g + 1g on the A30."""
    picks = (model.by_index(i) for i in (_P3, _P2, _P1, _P1))
    return tuple(p for p in picks if p is not None)
