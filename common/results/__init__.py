"""The results folder: every name in it (``layout``), the journal that makes ``--resume`` possible,
the hold that keeps two runs apart, atomic outputs, write failures such as a full disk
(``failures``), status.json (``status_file``) and safe reads of the run's own files.

May import the package root only.
"""
