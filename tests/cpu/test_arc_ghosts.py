"""ARC's ghost lists against an OrderedDict model: same keys in the same order after every call,
and stale copies bounded (the list keeps a dict and a deque, not an OrderedDict)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from hypothesis import given
from hypothesis import strategies as st

from kvref.base import OffloadKey, make_offload_key
from kvref.cpu.policies._arc_ghosts import GhostList


def to_key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def to_keys(ints: Iterable[int]) -> list[OffloadKey]:
    return [to_key(i) for i in ints]


def check(ghosts: GhostList, model: OrderedDict[OffloadKey, None]) -> None:
    assert list(ghosts) == list(model)
    assert len(ghosts) == len(model) and bool(ghosts) == bool(model)
    assert all(key in ghosts for key in model)
    # Every key's count is its number of copies, positive exactly for the ghosts.
    for key, count in ghosts.copies.items():
        assert count != 0 and abs(count) == ghosts.order.count(key)
        assert (count > 0) == (key in model)
    assert set(ghosts.order) == set(ghosts.copies)
    assert len(ghosts.order) <= 2 * len(ghosts) + 64


# One operation: (name, keys); keys are drawn from a small universe so keys come and go often.
operations = st.lists(
    st.tuples(
        st.sampled_from(["extend", "refresh", "discard", "trim", "clear"]),
        st.lists(st.integers(0, 11), max_size=4),
    ),
    max_size=400,
)


@given(operations)
def test_ghost_list_behaves_like_an_ordered_dict(ops: list[tuple[str, list[int]]]) -> None:
    ghosts = GhostList()
    model: OrderedDict[OffloadKey, None] = OrderedDict()
    for name, ints in ops:
        keys = to_keys(ints)
        if name == "extend":  # only keys that are not ghosts, once each (as evictions add them)
            new = [key for key in dict.fromkeys(keys) if key not in model]
            ghosts.extend(new)
            model.update(dict.fromkeys(new))
        elif name == "refresh":
            for key in keys:
                if key in model:
                    ghosts.refresh(key)
                    model.move_to_end(key)
        elif name == "discard":
            ghosts.discard(keys)
            for key in keys:
                model.pop(key, None)
        elif name == "trim":
            ghosts.trim(len(ints))
            while len(model) > len(ints):
                model.popitem(last=False)
        else:
            ghosts.clear()
            model.clear()
        check(ghosts, model)


def test_refreshes_do_not_grow_the_list_without_bound() -> None:
    ghosts = GhostList()
    ghosts.extend(to_keys([1, 2]))
    copies = ghosts.copies
    for _ in range(1000):
        ghosts.refresh(to_key(1))
        ghosts.refresh(to_key(2))
    assert list(ghosts) == to_keys([1, 2])
    assert len(ghosts.order) <= 2 * 2 + 64
    assert ghosts.copies is copies  # rebuilt in place: ARC holds it across calls


def test_a_discarded_key_added_again_takes_its_new_place() -> None:
    # Its stale copy comes first and must not be taken for it.
    ghosts = GhostList()
    ghosts.extend(to_keys([1, 2]))
    ghosts.discard(to_keys([1]))
    ghosts.extend(to_keys([3, 1]))
    assert list(ghosts) == to_keys([2, 3, 1])
    ghosts.trim(2)
    assert list(ghosts) == to_keys([3, 1])
    assert ghosts.copies == {to_key(3): 1, to_key(1): 1}
