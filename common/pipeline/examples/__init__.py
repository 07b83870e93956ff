"""Step functions of the shipped ML pipeline (examples/pipelines/): train -> evaluate -> report.

Each is a ``python: module:function`` step: called without arguments, it reads its settings from
the environment (the step's ``env``) and passes files through ``$PIPELINE_SHARED``.
"""
