"""``python -m common.pipeline DEFINITION [--results DIR] [--gpu ...] [--workers N] [--resource NAME=N]``."""
from common.pipeline.app import PipelineApp
from common.runner import main

if __name__ == "__main__":
    raise SystemExit(main(PipelineApp))
