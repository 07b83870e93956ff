"""Session fixtures shared by several test modules (one definition each, so one instance per session)."""
from vcluster import vcluster  # noqa: F401  (the virtual multi-node cluster)
