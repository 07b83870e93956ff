"""Work items and their seeds: the unit the engine distributes, journals and retries."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, List, Mapping

if TYPE_CHECKING:  # imported by the functions that need it: rank 0 may never need numpy (0.1 s of CPU)
    import numpy as np


@dataclass(frozen=True)
class Item:
    """One unit of work.

    key:    unique, stable name of the item ("C=3,gamma=1,fold=0"). Journal, resume and
            seeds are keyed by it, so it must not depend on rank, worker or order.
    params: plain, picklable arguments of the app's per-item function.
    cost:   expected relative cost; the most expensive items are handed out first.
    after:  keys this item waits for (a later wave). Rank 0 fills in its params from their
            results with ``App.complete`` just before it is handed out.
    group:  items of one group that are ready together go to one worker at once, through
            ``App.run_group`` (e.g. the folds of one model, trained side by side).
    """

    key: str
    params: Mapping[str, Any] = field(default_factory=dict)
    cost: float = 1.0
    after: tuple = ()
    group: str = ""

    def __reduce__(self) -> tuple:
        """Pickled as its fields in a row: rank 0 pickles every item it hands out, and the default
        way (the instance's ``__dict__``) is slower and leaves each item handed out a dict of its
        own at rank 0 (64 bytes more per item for the rest of the run)."""
        return Item, item_row(self)


#: an item's fields in order, as one tuple (``Item(*row)`` makes it again)
item_row = attrgetter(*(f.name for f in fields(Item)))


def item_seed(seed: int, key: str) -> np.random.SeedSequence:
    """The item's own random stream: a function of ``--seed`` and the item key only."""
    import numpy as np

    digest = hashlib.sha256(key.encode("utf-8")).digest()
    words = tuple(int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4))
    return np.random.SeedSequence(entropy=int(seed), spawn_key=words)


def torch_seed(seed_sequence: np.random.SeedSequence) -> int:
    """A 63-bit integer for ``torch.manual_seed`` drawn from the item's seed sequence."""
    import numpy as np

    return int(seed_sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


#: the constants of numpy's SeedSequence.generate_state (its INIT_B and MULT_B), for item_seed32
_INIT_B, _MULT_B, _MASK32 = 0x8B51F9DD, 0x58F38DED, 0xFFFFFFFF
_HASH_B = (_INIT_B * _MULT_B) & _MASK32


def item_seed32(seed_sequence: np.random.SeedSequence) -> int:
    """32 bits of the item's own stream, which numpy, ``random``, torch and scikit-learn all take
    (the ``seed`` a sweep function receives): ``seed_sequence.generate_state(1)[0]``, worked out
    as numpy does (the first word of the pool, hashed) in a sixth of the time numpy's array
    set-up takes, once per item of a sweep; tests/test_sweep.py checks the two agree."""
    import numpy as np  # already imported by whoever made the sequence: a lookup

    if type(seed_sequence) is not np.random.SeedSequence:
        return int(seed_sequence.generate_state(1)[0])
    word = ((int(seed_sequence.pool[0]) ^ _INIT_B) * _HASH_B) & _MASK32
    return word ^ (word >> 16)


def seed32(seed: int) -> int:
    """A seed for consumers that take 32-bit ones (scikit-learn): ``seed`` itself when it fits (so
    earlier runs' small seeds give the same results), else one word derived with SeedSequence."""
    if 0 <= seed < 2 ** 32:
        return int(seed)
    import numpy as np

    return int(np.random.SeedSequence(int(seed)).generate_state(1)[0])


#: the rest of numpy's SeedSequence constants (its INIT_A, MULT_A, MIX_MULT_L, MIX_MULT_R and
#: DEFAULT_POOL_SIZE), for ItemSeeds.word32
_INIT_A, _MULT_A, _MIX_L, _MIX_R, _POOL_SIZE = 0x43B0D7E5, 0x931E8875, 0xCA01F9DD, 0x4973F715, 4
#: the forms of an item's seed an app may take (``App.seed_form``)
SEED_FORMS = ("sequence", "int32")


class ItemSeeds:
    """The items' seeds of one run (``--seed``), made by each worker for the items it runs.

    ``sequence(key)`` is :func:`item_seed` (what ``App.run_item`` receives). ``word32(key)`` is
    ``item_seed32(item_seed(seed, key))`` (what a sweep function receives) worked out without
    the SeedSequence, in about a quarter of the time: numpy spends some 11 us assembling each
    sequence's entropy, a fifth of the engine's whole cost per item. numpy mixes the run's words
    into its pool before the key's, and its hash constants do not depend on the data, so the
    run's part is mixed once here and each key costs its four words against the pool's first
    word. A self-check against numpy at start-up falls back to numpy where they would differ."""

    def __init__(self, seed: int):
        self.seed = seed
        self._first: Any = None  # (the pool's first word after the run's words, the key words' constants)
        if isinstance(seed, int) and seed >= 0:
            self._first = _run_mixed(seed)
            probe = "multinode-gpu"
            if self.word32(probe) != int(self.sequence(probe).generate_state(1)[0]):  # numpy's own word
                self._first = None

    def sequence(self, key: str) -> np.random.SeedSequence:
        return item_seed(self.seed, key)

    def word32(self, key: str) -> int:
        if self._first is None:
            return item_seed32(self.sequence(key))
        word, constants = self._first
        key_words = struct.unpack_from("<4I", hashlib.sha256(key.encode("utf-8")).digest())
        for key_word, (before, after) in zip(key_words, constants):
            hashed = ((key_word ^ before) * after) & _MASK32
            hashed ^= hashed >> 16
            word = (_MIX_L * word - _MIX_R * hashed) & _MASK32
            word ^= word >> 16
        word = ((word ^ _INIT_B) * _HASH_B) & _MASK32
        return word ^ (word >> 16)

    def maker(self, form: str) -> Callable[[str], Any]:
        """key -> seed in ``form`` (one of SEED_FORMS)."""
        check_seed_form(form)
        return self.word32 if form == "int32" else self.sequence


def check_items(owner: str, items: Any) -> List[Item]:
    """What an app's ``items()`` returned (``owner``: "MyApp.items()"), as a list, checked before
    anything runs; ValueError naming the first thing wrong: a return that is not a list of
    :class:`Item`, a key that is not a non-empty str, a key given twice, an ``after`` naming no item.
    (Rank 0 would otherwise fail later with a traceback, after making the results folder.)"""
    if isinstance(items, (str, bytes, Mapping)) or not hasattr(items, "__iter__"):
        raise ValueError(f"{owner} returned {type(items).__name__ if items is not None else 'None'}, not a list of "
                         f"common.Item")
    items = list(items)
    seen = set()
    for item in items:
        if not isinstance(item, Item):
            raise ValueError(f"{owner} returned a {type(item).__name__} among its items, not a common.Item: {item!r:.80}")
        if type(item.key) is not str or not item.key:
            raise ValueError(f"{owner}: an item key must be a non-empty str, not {item.key!r} "
                             f"({type(item.key).__name__})")
        if item.key in seen:
            raise ValueError(f"{owner}: the item key {item.key!r} is given twice (keys name the items in the journal "
                             f"and their seeds: each must be unique)")
        seen.add(item.key)
    for item in items:
        unknown = [key for key in item.after if key not in seen]
        if unknown:
            raise ValueError(f"{owner}: item {item.key!r} waits for {', '.join(map(repr, unknown))}, which no item is "
                             f"(after names other items' keys)")
    return items


def check_seed_form(form: str) -> None:
    """ValueError unless ``form`` is one of SEED_FORMS (``App.seed_form``)."""
    if form not in SEED_FORMS:
        raise ValueError(f"seed_form must be one of {', '.join(SEED_FORMS)}, not {form!r}")


def _run_mixed(seed: int) -> tuple:
    """numpy's ``mix_entropy`` of an item's entropy (``seed``'s 32-bit words, padded with zeros to
    the pool's size, then the key's four) up to the key's words: the pool's first word, and the
    (before, after) hash constants each key word meets on its way into that word."""
    run: List[int] = []
    while True:
        run.append(seed & _MASK32)
        seed >>= 32
        if not seed:
            break
    run += [0] * (_POOL_SIZE - len(run))
    constant = _INIT_A
    steps: List[tuple] = []

    def hashmix(value: int) -> int:
        nonlocal constant
        before, constant = constant, (constant * _MULT_A) & _MASK32
        steps.append((before, constant))
        value = ((value ^ before) * constant) & _MASK32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        result = (_MIX_L * x - _MIX_R * y) & _MASK32
        return result ^ (result >> 16)

    pool = [hashmix(word) for word in run[:_POOL_SIZE]]
    for source in range(_POOL_SIZE):
        for target in range(_POOL_SIZE):
            if source != target:
                pool[target] = mix(pool[target], hashmix(pool[source]))
    for word in run[_POOL_SIZE:]:
        for target in range(_POOL_SIZE):
            pool[target] = mix(pool[target], hashmix(word))
    steps.clear()
    for _ in range(4 * _POOL_SIZE):  # the key's words, each mixed into every word of the pool in turn
        hashmix(0)
    return pool[0], tuple(steps[::_POOL_SIZE])
