"""What users see while and after a run: progress lines, logs, the GPU monitor and its plot, the
timeline, report.html (``python -m common.status`` reads a running job from the results folder).

May import ``results`` and the package root.
"""
