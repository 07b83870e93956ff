"""In-process stand-ins for tests and benchmarks: the engine's scheduling without processes.

May import every engine layer; nothing in the engine imports it.
"""
