"""A stand-in for cuML (tests only): ``cuml.svm.SVC`` with the pinned releases' constructor."""
__version__ = "26.02.00"
