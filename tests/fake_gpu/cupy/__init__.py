"""CuPy as NumPy, for tests on a machine without a GPU: "device" arrays are host arrays.

Only what is CuPy's API too is used by the project. Each function the project calls has CuPy
14.2.0's signature exactly (tests/test_api_snapshot.py checks it against the recorded one, and the
project's calls against 13.6.0's too); ``asnumpy`` copies, as a device-to-host copy does.
"""
import numpy as _np
from numpy import *  # noqa: F401,F403  (CuPy's array API is NumPy's)

__version__ = "14.2.0"


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):  # noqa: ARG001 (CuPy 13.6 and 14.2)
    """A host copy, as CuPy's device-to-host copy."""
    return _np.array(a, order=order, copy=True)


# NumPy's own keywords passed on only where given: NumPy before 2.0 (setup.cfg allows 1.23) lacks
# asarray's copy, and before 1.24 unique's equal_nan and stack's dtype and casting


def _given(**keywords):
    return {name: value for name, value in keywords.items() if value is not None}


def asarray(a, dtype=None, order=None, *, copy=None, blocking=False):  # noqa: ARG001
    return _np.asarray(a, dtype=dtype, order=order, **_given(copy=copy))


def asfortranarray(a, dtype=None):
    return _np.asfortranarray(a, dtype=dtype)


def unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None, *, equal_nan=True):
    return _np.unique(ar, return_index, return_inverse, return_counts, axis,
                      **_given(equal_nan=None if equal_nan else False))


def concatenate(tup, axis=0, out=None, *, dtype=None, casting="same_kind"):
    return _np.concatenate(tup, axis=axis, out=out, **_given(dtype=dtype, casting=None if casting == "same_kind" else casting))


def stack(tup, axis=0, out=None, *, dtype=None, casting="same_kind"):
    return _np.stack(tup, axis=axis, out=out, **_given(dtype=dtype, casting=None if casting == "same_kind" else casting))


def argmax(a, axis=None, dtype=None, out=None, keepdims=False):
    """CuPy's third parameter is the index dtype (NumPy's is ``out``)."""
    index = _np.argmax(a, axis=axis, out=out, keepdims=keepdims)
    return index if dtype is None else index.astype(dtype)
