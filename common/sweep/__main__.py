"""``python -m common.sweep MODULE:FUNCTION --grid FILE | --points FILE | --space FILE --samples N``."""
from common.signals import defer_stop_signals

defer_stop_signals()  # before the slow imports: Ctrl-C meanwhile ends the run quietly, not in a traceback

from common.run.runner import main  # noqa: E402
from common.sweep.app import SweepApp  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(SweepApp))
