"""Step functions of the shipped ML pipeline (ml.json and sweep.json beside this folder):
train -> evaluate -> report.

Each is a ``python: ml_steps.STEP:main`` step (the definition file's folder is on a python step's
import path): called without arguments, it reads its settings from the environment (the step's
``env``) and passes files through ``$PIPELINE_SHARED``. They use the engine's ``common`` (data
loading, atomic writes), no app.
"""
