"""Work items and their seeds: the unit the engine distributes, journals and retries."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Mapping

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
