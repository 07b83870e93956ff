"""CuPy as NumPy, for tests on a machine without a GPU: "device" arrays are host arrays.

Only what is CuPy's API too is used by the project; ``asnumpy`` copies, as a device-to-host copy does.
"""
from numpy import *  # noqa: F401,F403  (CuPy's array API is NumPy's)
from numpy import array as _array

__version__ = "14.2.0"


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):  # noqa: ARG001 (CuPy 13.6 and 14.2)
    """A host copy, as CuPy's device-to-host copy."""
    return _array(a, order=order, copy=True)
