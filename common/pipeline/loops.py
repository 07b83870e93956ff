"""Which loops in a pipeline can run forever.

The walk can move from step i to: its ``next`` (or i+1) after success, its ``on_fail`` after a
failure, and i+1 after an unhandled failure or a skip. A step that sets ``max_retries: N`` runs at
most 1 + N times in one run of the pipeline (retries in place and returns through a loop both
count), and every arrival at it counts, a skip included; coming back to it once more ends the
pipeline as failed. So a loop is bounded when it passes through a step with ``max_retries`` and no
``condition``; a definition with any other loop is refused. A step with a ``condition`` does not
count as a bound: whether it runs depends on the step before it, which is easy to misjudge.
"""
from __future__ import annotations

import graphlib
from typing import Any, Dict, List, Protocol, Sequence


class Pipeline(Protocol):
    """What these checks read of a ``definition.Pipeline`` (named here so that definition, which
    calls them, and this module do not import each other)."""

    @property
    def step_ids(self) -> Sequence[str]: ...

    @property
    def steps(self) -> Sequence[Any]: ...


def moves(pipeline: "Pipeline") -> Dict[str, List[str]]:
    """Every step the walk may go to from each step (a superset of what really happens)."""
    ids = pipeline.step_ids
    graph = {}
    for position, step in enumerate(pipeline.steps):
        following = ids[position + 1] if position + 1 < len(ids) else None
        targets = [step.next, step.on_fail, following]
        graph[step.id] = sorted({target for target in targets if target is not None})
    return graph


def bounding_steps(pipeline: "Pipeline") -> List[str]:
    """The steps that bound a loop through them: ``max_retries`` set and no ``condition``."""
    return [step.id for step in pipeline.steps if step.max_retries is not None and step.condition is None]


def unbounded_cycle(pipeline: "Pipeline") -> List[str]:
    """The steps of one loop without a bounding step on it, or [] if there is none."""
    bounded = set(bounding_steps(pipeline))
    graph = {node: [t for t in targets if t not in bounded]
             for node, targets in moves(pipeline).items() if node not in bounded}
    try:
        # each step's moves as its "predecessors": graphlib reports a cycle against the moves
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        cycle = list(reversed(error.args[1][1:]))  # [a, c, b, a] -> [b, c, a]: in the walk's order
        order = {step: position for position, step in enumerate(pipeline.step_ids)}
        first = min(range(len(cycle)), key=lambda index: order.get(cycle[index], len(order)))
        return cycle[first:] + cycle[:first]  # from its first step in the file
    return []
