"""The choice of a MIG placement (gpuledger_core.mig_place): a table of the cases that matter and
hypothesis properties over random cards and requests: every choice is one the ledger takes, never
two instances on overlapping slices, never a profile or placement the model does not offer, and
no other placement would leave the workload more of the card."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.mig import share_of, takes
from gpuledger_core.mig_layout import fits_at
from gpuledger_core.mig_place import CardView, MigChooser, MigWorkload
from gpuledger_core.mig_profiles import A30_24GB, A100_40GB, H100_80GB, MigModel
from gpuledger_core.model import MIG_SMALLEST, Card, CardMode, MigInstance, MigSlot, Node, Request
from tests.unit.core.builders import NODE, card, holding

NAMES = {A100_40GB.name: "NVIDIA A100-SXM4-40GB", A30_24GB.name: "NVIDIA A30", H100_80GB.name: "NVIDIA H100 80GB HBM3"}
MEMORY = {A100_40GB.name: 40960, A30_24GB.name: 24576, H100_80GB.name: 81559}


def mig_card(model: MigModel = A100_40GB, index: int = 0, *instances: MigInstance) -> Card:
    plain = card(index, MEMORY[model.name], model=NAMES[model.name])
    return replace(plain, mode=CardMode.MIG, instances=instances)


def slot(model: MigModel, name: str, start: int) -> MigSlot:
    p = model.by_name(name)
    assert p is not None
    return MigSlot(name, start, p.memory_slices)


def test_a_1g_on_an_empty_card_leaves_the_larger_profiles_their_room() -> None:
    chosen = MigChooser().choose([CardView(mig_card())], Request(mig="1g.5gb"))
    assert chosen is not None
    at, option = chosen
    assert (at, option.slot.start, option.made) == (0, 6, True)  # 4g at 0, 2g at 4 still fit


def test_a_card_already_broken_goes_before_an_empty_one() -> None:
    broken = CardView(mig_card(A100_40GB, 1), (slot(A100_40GB, "3g.20gb", 4),))
    chosen = MigChooser().choose([CardView(mig_card(A100_40GB, 0)), broken], Request(mig="1g.5gb"))
    assert chosen is not None and chosen[0] == 1


def test_a_free_instance_goes_before_making_one_on_a_tie() -> None:
    made = MigInstance(slot(A100_40GB, "3g.20gb", 4), static=True)
    views = [CardView(mig_card(A100_40GB, 0)), CardView(mig_card(A100_40GB, 1, made))]
    chosen = MigChooser(MigWorkload.of(["3g.20gb"])).choose(views, Request(mig="3g.20gb"))
    assert chosen is not None
    at, option = chosen
    assert (at, option.slot, option.made) == (1, made.slot, False)


def test_an_idle_instance_made_on_demand_counts_as_room_and_small_asks_share_a_card() -> None:
    """Cards whose only instance is an idle 7g.40gb made on demand (kept for reuse) are chosen as
    empty cards are: the second ask joins the card the first took. Counted as occupying, the idle
    instance made each such card worth only itself, and the 1g.10gb went to the other card."""
    idle = MigInstance(slot(A100_40GB, "7g.40gb", 0), static=False)
    workload = MigWorkload.of(["1g.5gb", "4g.20gb", "1g.10gb", "7g.40gb"])
    for cards in (
        (mig_card(A100_40GB, 0), mig_card(A100_40GB, 1)),
        (mig_card(A100_40GB, 0, idle), mig_card(A100_40GB, 1, idle)),
    ):
        chooser, views, got = MigChooser(workload), [CardView(c) for c in cards], []
        for profile in ("4g.20gb", "1g.10gb"):
            chosen = chooser.choose(views, Request(mig=profile))
            assert chosen is not None
            at, option = chosen
            views[at] = CardView(views[at].card, (*views[at].held, option.slot))
            got.append((at, option.slot.profile, option.slot.start))
        assert got == [(0, "4g.20gb", 0), (0, "1g.10gb", 6)], cards
    same = MigChooser(MigWorkload.of(["7g.40gb"])).choose(
        [CardView(mig_card(A100_40GB, 0)), CardView(mig_card(A100_40GB, 1, idle))], Request(mig="7g.40gb")
    )
    assert same is not None and (same[0], same[1].made) == (1, False)  # the idle instance is taken as it is


def test_without_on_demand_only_free_instances_are_taken() -> None:
    chooser = MigChooser(on_demand=False)
    assert chooser.choose([CardView(mig_card())], Request(mig="1g.5gb")) is None
    free = MigInstance(slot(A100_40GB, "1g.5gb", 3))
    chosen = chooser.choose([CardView(mig_card(A100_40GB, 0, free))], Request(mig="1g.5gb"))
    assert chosen is not None and chosen[1].slot == free.slot


def test_a_faulted_instance_is_never_chosen() -> None:
    chooser = MigChooser(on_demand=False)
    faulted = MigInstance(slot(A100_40GB, "1g.5gb", 3), fault="XID 43")
    assert chooser.choose([CardView(mig_card(A100_40GB, 0, faulted))], Request(mig="1g.5gb")) is None
    healthy = MigInstance(slot(A100_40GB, "1g.5gb", 4))
    chosen = chooser.choose([CardView(mig_card(A100_40GB, 0, faulted, healthy))], Request(mig="1g.5gb"))
    assert chosen is not None and chosen[1].slot == healthy.slot


def test_the_workload_decides_which_future_profiles_count() -> None:
    """A 2g.10gb: with a workload of 4g.20gb it keeps the first half whole; of 3g.20gb either half
    will do, and the lowest start breaks the tie; 1g.10gb at 0 is then a worse choice than 2g's own."""
    card_ = CardView(mig_card())
    fours = MigChooser(MigWorkload.of(["4g.20gb"] * 3 + ["2g.10gb"])).choose([card_], Request(mig="2g.10gb"))
    assert fours is not None and fours[1].slot.start == 4
    threes = MigChooser(MigWorkload.of(["3g.20gb"] * 3 + ["2g.10gb"])).choose([card_], Request(mig="2g.10gb"))
    assert threes is not None and threes[1].slot.start == 0


def test_the_smallest_profile_is_chosen_per_card_model() -> None:
    views = [CardView(mig_card(A30_24GB, 0)), CardView(mig_card(H100_80GB, 1))]
    request = Request(mem_mib=9000, mig=MIG_SMALLEST)
    on_a30 = MigChooser().best(views[0], request)
    on_h100 = MigChooser().best(views[1], request)
    assert on_a30 is not None and on_a30.slot.profile == "2g.12gb"
    assert on_h100 is not None and on_h100.slot.profile == "1g.10gb"


def test_cards_not_in_mig_mode_unhealthy_or_of_another_model_take_nothing() -> None:
    plain = card(0, 40960, model=NAMES[A100_40GB.name])
    sick = replace(mig_card(A100_40GB, 1), health=card(1, healthy=False).health)
    other = CardView(mig_card(A100_40GB, 2))
    chooser = MigChooser()
    assert chooser.choose([CardView(plain), CardView(sick)], Request(mig="1g.5gb")) is None
    assert chooser.choose([other], Request(mig="1g.5gb", models=frozenset({"H100"}))) is None
    assert chooser.choose([other], Request(mig="1g.6gb")) is None  # an A30 profile


MODELS = [A100_40GB, A30_24GB, H100_80GB]


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[Card], list[Request], MigWorkload]:
    model = draw(st.sampled_from(MODELS))
    names = [p.name for p in model.profiles]
    cards = [mig_card(model, i) for i in range(draw(st.integers(1, 3)))]
    asked = draw(st.lists(st.sampled_from([*names, "7g.80gb", "smallest"]), min_size=1, max_size=14))
    requests = [
        Request(mem_mib=draw(st.integers(1, model.whole.memory_mib)), mig=MIG_SMALLEST)
        if name == "smallest"
        else Request(mig=name)
        for name in asked
    ]
    workload = MigWorkload.of(draw(st.lists(st.sampled_from(names), max_size=6)))
    return cards, requests, workload


def _value(model: MigModel, held: list[MigSlot], workload: MigWorkload) -> float:
    """What the card can still serve of the workload, counted apart from ``mig_place``: for each
    profile, place instances greedily in start order while NVIDIA's rules allow."""
    total = 0.0
    for p, w in workload.on(model):
        taken = [(model.by_name(s.profile), s.start) for s in held]
        room = 0
        for start in p.starts:
            if fits_at(model, p, start, taken):  # type: ignore[arg-type]
                taken.append((p, start))
                room += 1
        total += w * room * p.memory_slices
    return total


@settings(max_examples=150, deadline=None)
@given(scenes())
def test_every_choice_is_one_the_ledger_takes_and_the_best_for_the_workload(
    scene: tuple[list[Card], list[Request], MigWorkload],
) -> None:
    cards, requests, workload = scene
    chooser = MigChooser(workload)
    ledger = NodeLedger(Node(NODE, tuple(cards)))
    held: list[list[MigSlot]] = [[] for _ in cards]
    for n, request in enumerate(requests):
        views = [CardView(c, tuple(h)) for c, h in zip(cards, held, strict=True)]
        chosen = chooser.choose(views, request)
        if chosen is None:
            continue
        at, option = chosen
        model = A100_40GB if "A100" in cards[at].model else A30_24GB if "A30" in cards[at].model else H100_80GB
        profile = model.by_name(option.slot.profile)
        assert profile is not None  # a profile the model offers
        assert option.slot.start in profile.starts and option.slot.size == profile.memory_slices
        assert not any(option.slot.overlaps(h) for h in held[at])  # never on held slices
        assert takes(cards[at], model, option.slot, held[at]) == ""
        others = [
            s
            for s in profile.starts
            if takes(cards[at], model, MigSlot(profile.name, s, profile.memory_slices), held[at]) == ""
        ]
        best = max(
            _value(model, [*held[at], MigSlot(profile.name, s, profile.memory_slices)], workload) for s in others
        )
        assert abs(_value(model, [*held[at], option.slot], workload) - best) < 1e-9
        ledger = reserve(ledger, holding(f"a{n}", share_of(cards[at], profile, option.slot.start)))
        held[at].append(option.slot)
