"""``python -m common.pipeline DEFINITION [--results DIR] [--gpu ...] [--agent CMD] [--dry-run] ...``;
``python -m common.pipeline --schema`` prints the definition format as JSON Schema."""
import json
import sys

from common.pipeline.app import PipelineApp
from common.pipeline.schema import SCHEMA
from common.runner import main

if __name__ == "__main__":
    if "--schema" in sys.argv[1:]:
        print(json.dumps(SCHEMA, indent=2))
        raise SystemExit(0)
    raise SystemExit(main(PipelineApp))
