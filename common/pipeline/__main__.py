"""``python -m common.pipeline DEFINITION [--results DIR] [--gpu ...] [--agent CMD] [--dry-run] ...``;
``python -m common.pipeline --schema`` prints the definition format as JSON Schema."""
from common.signals import defer_stop_signals
from common.startup import guard_standard_streams, stdout_lost

defer_stop_signals()  # before the slow imports: Ctrl-C meanwhile ends the run quietly, not in a traceback
guard_standard_streams()  # --schema | head -1 too

import json  # noqa: E402
import sys  # noqa: E402

from common.errors import EXIT_NOT_WRITTEN, EXIT_OK, EXIT_USAGE  # noqa: E402
from common.pipeline.app import PipelineApp  # noqa: E402
from common.pipeline.schema import SCHEMA  # noqa: E402
from common.run.runner import main  # noqa: E402

if __name__ == "__main__":
    if "--schema" in sys.argv[1:]:
        others = [arg for arg in sys.argv[1:] if arg != "--schema"]
        if others:  # a definition or flags beside it would be silently ignored
            print(f"pipeline: error: --schema takes no other arguments, got {' '.join(others)!r}", file=sys.stderr)
            raise SystemExit(EXIT_USAGE)
        print(json.dumps(SCHEMA, indent=2))
        lost = stdout_lost()
        if lost:
            print(f"pipeline: error: --schema: the schema could not be written to stdout ({lost})", file=sys.stderr)
        raise SystemExit(EXIT_NOT_WRITTEN if lost else EXIT_OK)
    raise SystemExit(main(PipelineApp))
