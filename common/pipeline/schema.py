"""The definition format as one JSON Schema: checked with jsonschema, shipped for editors.

``python -m common.pipeline --schema`` prints :data:`SCHEMA`. Every field's ``title`` says what
it must be, so a value that does not fit becomes one line such as ``timeout must be a positive
number of seconds up to 31536000, got -5``. What a schema cannot say (a step named by ``next``
exists, loops are bounded, memory sizes, image files) is checked in definition.py.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

import jsonschema
import jsonschema.validators

from common.errors import as_written, json_type
from common.results.layout import LOGS_DIR, SHARED_DIR

#: a year: longer timeouts are no limit at all, and past ~1e11 s the clock's arithmetic overflows
MAX_SECONDS = 365 * 24 * 3600
#: retries in place of one step; 10**12 would retry for ever (and fill the disk with logs)
MAX_RETRIES = 1000
#: the first wait before a retry; each later one doubles, up to this too
MAX_RETRY_DELAY = 24 * 3600
MAX_BUDGET = 10 ** 9
#: pipelines one ``matrix`` may expand to
MAX_MATRIX = 1000
#: pipeline names and step ids name folders: well under the file systems' 255 bytes a name
MAX_NAME_LENGTH = 100

NAME = "^[A-Za-z0-9_-]+$"
NAME_RULE = "use letters, digits, '-' and '_' only"
POOL = "^[A-Za-z][A-Za-z0-9_]*$"
ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"
PYTHON_TARGET = "^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
CONDITIONS = ("prev.ok", "prev.error")


def _seconds(title: str = "a positive number of seconds") -> Dict[str, Any]:
    return {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS,
            "title": f"{title} up to {MAX_SECONDS}"}


#: a tool name: no ',', not only spaces (names are trimmed); a string of them separated by ','
TOOL_NAME = "^[^,]*[^,\\s][^,]*$"
TOOL_LIST = "^[^,]*[^,\\s][^,]*(,[^,]*[^,\\s][^,]*)*$"
#: where a step's image comes from when it names none: its pipeline's, the file's, --container, PIPELINE_CONTAINER
IMAGE = {"type": "string", "pattern": "\\S", "title": "the path (or URI) of an image",
         "description": "relative paths are relative to the definition file"}

MOUNT = {
    "type": "object", "title": "an object {host_path, container_path, readonly}",
    "properties": {
        "host_path": {"type": "string", "minLength": 1, "title": "a path",
                      "description": "relative paths are relative to the definition file"},
        "container_path": {"type": "string", "pattern": "^/[^:]*$", "title": "an absolute path without ':'"},
        "readonly": {"type": "boolean", "title": "true or false"},
    },
    "required": ["host_path", "container_path"],
    "additionalProperties": False,
}

STEP = {
    "type": "object", "title": "an object with an id",
    "properties": {
        "id": {"type": "string", "pattern": NAME, "maxLength": MAX_NAME_LENGTH, "not": {"const": SHARED_DIR},
               "title": "the step's name", "description": "names the step's folder RUN_ID/STEP_ID"},
        "command": {"type": "string", "minLength": 1, "pattern": "\\S", "title": "a non-empty shell command",
                    "description": "run with /bin/sh -c in the step's folder"},
        "python": {"type": "string", "pattern": PYTHON_TARGET, "title": "'module:function'",
                   "description": "called without arguments; a returned dict is saved as result.json"},
        "prompt": {"type": "string", "minLength": 1, "title": "non-empty text",
                   "description": "given on standard input to the agent command (--agent or PIPELINE_AGENT); "
                                  "its standard output becomes output.md"},
        "model": {"type": "string", "minLength": 1, "title": "a model name",
                  "description": "for the agent, as PIPELINE_MODEL"},
        "tools": {"title": "a list of tool names or one comma-separated string of them",
                  "description": "for the agent, as PIPELINE_TOOLS (comma-separated); names are trimmed",
                  "oneOf": [
                      {"type": "array", "uniqueItems": True, "title": "a list of tool names",
                       "items": {"type": "string", "pattern": TOOL_NAME, "title": "a tool name without ','"}},
                      {"type": "string", "pattern": TOOL_LIST,
                       "title": "tool names separated by ',' (such as 'Read,Write,Bash'), none of them empty"},
                  ]},
        "gpu": {"type": "boolean", "title": "true or false", "description": "hold one GPU of the node"},
        "resources": {
            "title": "a list of pool names or {name: count}",
            "oneOf": [
                {"type": "array", "uniqueItems": True, "items": {"type": "string", "pattern": POOL,
                                                                 "title": "a pool name"}},
                {"type": "object", "propertyNames": {"pattern": POOL, "title": "a valid pool name: a letter, then letters, digits, '_'"},
                 "additionalProperties": {"type": "integer", "minimum": 1, "title": "a positive whole number"}},
            ]},
        "timeout": _seconds(),
        "on_fail": {"type": "string", "title": "the id of a step"},
        "condition": {"enum": list(CONDITIONS), "title": "one of " + ", ".join(CONDITIONS)},
        "next": {"type": "string", "title": "the id of a step"},
        "max_retries": {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES,
                        "title": f"a whole number from 0 to {MAX_RETRIES}"},
        "retry_delay": {"type": "number", "minimum": 0, "maximum": MAX_RETRY_DELAY,
                        "title": f"a number of seconds from 0 to {MAX_RETRY_DELAY}",
                        "description": "wait before the first retry; doubled before each later one"},
        "env": {"type": "object", "title": "an object of NAME: value",
                "propertyNames": {"pattern": ENV_NAME, "title": "a valid variable name"},
                "additionalProperties": {"type": ["string", "number"], "title": "a string or a number"}},
        "memory": {"type": ["string", "integer"], "title": "a size such as '16g' or '512m', or bytes"},
        "container": IMAGE,
        "mounts": {"type": "array", "items": MOUNT, "title": "a list of {host_path, container_path, readonly}",
                   "description": "need an image: the step's, its pipeline's or file's 'container', "
                                  "--container IMAGE or PIPELINE_CONTAINER"},
    },
    "required": ["id"],
    "additionalProperties": False,
    "oneOf": [{"required": ["command"]}, {"required": ["python"]}, {"required": ["prompt"]}],
    "dependentRequired": {"model": ["prompt"], "tools": ["prompt"]},
}

#: one task of a par() file: a step without id (optional: it names the task) and without jumps
TASK = {
    **STEP, "title": "a task: an object such as a step, without next, on_fail, condition",
    "properties": {**{name: value for name, value in STEP["properties"].items()
                      if name not in ("next", "on_fail", "condition")},
                   "id": {"type": "string", "pattern": NAME, "maxLength": MAX_NAME_LENGTH,
                          "not": {"const": LOGS_DIR}, "title": "the task's name",
                          "description": "names its run's folder; default task-N"}},
    "required": [],
}

TASKS = {"type": "array", "minItems": 1, "maxItems": MAX_MATRIX, "items": TASK,
         "title": "a non-empty list of tasks (par)"}

TASKS_FILE = {
    "type": "object", "title": "an object {\"tasks\": [...]}",
    "properties": {"tasks": TASKS, "container": IMAGE},
    "required": ["tasks"],
    "additionalProperties": False,
}

PIPELINE = {
    "type": "object", "title": "an object with a name and steps",
    "properties": {
        "name": {"type": "string", "pattern": NAME, "maxLength": MAX_NAME_LENGTH, "not": {"const": LOGS_DIR},
                 "title": "the pipeline's name", "description": "the run's id and folder; ${name} of the matrix "
                                                               "may be used in it"},
        "deadline_seconds": _seconds(),
        "budget": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_BUDGET,
                   "title": f"a positive number up to {MAX_BUDGET}",
                   "description": "the most the steps' reported costs may add up to"},
        "matrix": {"type": "object", "minProperties": 1, "title": "an object of name: [values]",
                   "propertyNames": {"pattern": ENV_NAME, "title": "a valid name: a letter or '_', then letters, digits, '_'"},
                   "additionalProperties": {"type": "array", "minItems": 1, "uniqueItems": True,
                                            "items": {"type": ["string", "number", "boolean"],
                                                      "title": "a string, number or boolean"},
                                            "title": "a non-empty list of values"}},
        "steps": {"type": "array", "minItems": 1, "items": STEP, "title": "a non-empty list of steps"},
        "container": IMAGE,
    },
    "required": ["name", "steps"],
    "additionalProperties": False,
}

FILE = {
    "type": "object", "title": "an object {\"pipelines\": [...]}",
    "properties": {"pipelines": {"type": "array", "minItems": 1, "items": PIPELINE,
                                 "title": "a non-empty list of pipelines"},
                   "container": IMAGE},
    "required": ["pipelines"],
    "additionalProperties": False,
}

#: what ``--schema`` prints: one pipeline, or a file of them
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "multinode-gpu pipeline definition",
    "description": "One pipeline, {\"pipelines\": [...]}, or a par() list of tasks (or {\"tasks\": [...]}); "
                   "see docs/pipelines.md",
    "anyOf": [PIPELINE, FILE, TASKS, TASKS_FILE],
}

_WHAT = {"steps": "a step", "pipelines": "a pipeline", "mounts": "a mount"}


def _is_pattern(validator, pattern: str, instance: Any, schema: Dict[str, Any]) -> Iterator[Any]:
    """ECMA-262 patterns as editors read them: ``$`` is the end of the text, not 'before a final newline'."""
    if isinstance(instance, str):
        compiled = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern
        if not re.search(compiled, instance):
            yield jsonschema.ValidationError(f"does not match {pattern}")


# jsonschema's own checks put the ``repr`` of the value into their messages, and compare lists
# element by element; over a few hundred bytes of nested YAML aliases (shared, not copied) either
# takes hours. These say what failed without looking inside the value.
def _type(validator, types, instance: Any, schema: Dict[str, Any]) -> Iterator[Any]:
    types = [types] if isinstance(types, str) else types
    if not any(validator.is_type(instance, kind) for kind in types):
        yield jsonschema.ValidationError(f"not of type {', '.join(types)}")


def _enum(validator, choices, instance: Any, schema: Dict[str, Any]) -> Iterator[Any]:
    if not any(type(instance) is type(choice) and instance == choice for choice in choices):
        yield jsonschema.ValidationError("not one of the choices")


def _unique_items(validator, unique: bool, instance: Any, schema: Dict[str, Any]) -> Iterator[Any]:
    if unique and validator.is_type(instance, "array"):
        seen = set()
        for item in instance:  # the values we keep unique are scalars; others fail their own type
            key = (type(item).__name__, item) if isinstance(item, (str, int, float, bool)) else ("id", id(item))
            if key in seen:
                yield jsonschema.ValidationError("an entry is given twice")
                return
            seen.add(key)


def _length(limit: str):
    def check(validator, bound: int, instance: Any, schema: Dict[str, Any]) -> Iterator[Any]:
        if isinstance(instance, str) and (len(instance) < bound if limit == "min" else len(instance) > bound):
            yield jsonschema.ValidationError(f"{limit}Length {bound}")
    return check


def _one_of(validator, subschemas, instance: Any, schema: Dict[str, Any]) -> Iterator[Any]:
    errors, valid = [], []
    for index, subschema in enumerate(subschemas):
        found = list(validator.descend(instance, subschema, schema_path=index))
        if found:
            errors.extend(found)
        else:
            valid.append(index)
    if not valid:
        yield jsonschema.ValidationError("matches none of the choices", context=errors)
    elif len(valid) > 1:
        yield jsonschema.ValidationError("matches more than one of the choices")


_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {
    "pattern": _is_pattern, "type": _type, "enum": _enum, "uniqueItems": _unique_items, "oneOf": _one_of,
    "minLength": _length("min"), "maxLength": _length("max")})
_VALIDATORS = {"pipeline": _Validator(PIPELINE), "file": _Validator(FILE), "task": _Validator(TASK),
               "image": _Validator({"properties": {"container": IMAGE}}),
               "matrix": _Validator({"properties": {"matrix": PIPELINE["properties"]["matrix"]}})}


def did_you_mean(name: str, choices, otherwise: str = "") -> str:
    """' (did you mean 'x'?)' for the closest of ``choices``, else ``otherwise``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else otherwise


def first_error(kind: str, data: Any) -> Optional[Tuple[List[Any], str]]:
    """(path in ``data``, one-line problem) of the first place ``data`` breaks the schema, or None.

    Errors are read lazily, and messages are built from shortened values, never from
    jsonschema's own text (which holds the ``repr`` of the whole value).
    """
    error = next(iter(_VALIDATORS[kind].iter_errors(data)), None)
    if error is None:
        return None
    while error.validator in ("oneOf", "anyOf") and error.context:
        # the branch written for this kind of value (a list of pools, or {pool: count}) says what is wrong
        branches = error.validator_value
        fitting = [e for e in error.context if "type" in branches[e.relative_schema_path[0]]
                   and _Validator.TYPE_CHECKER.is_type(error.instance, branches[e.relative_schema_path[0]]["type"])]
        if not fitting:
            break
        error = fitting[0]
    return list(error.absolute_path), _problem(error)


def _label(path: List[Any]) -> str:
    """'timeout', 'env X', 'pool licence', 'a step' for the place an error points at."""
    fields = [part for part in path if isinstance(part, str)]
    if not fields:
        return "the file"
    if path and isinstance(path[-1], int) and isinstance(path[-2] if len(path) > 1 else None, str):
        parent = path[-2]
        return _WHAT.get(parent, f"each of {parent}")
    last = fields[-1]
    if len(path) >= 2 and path[-2] in ("env", "matrix") and isinstance(path[-1], str):
        return f"{path[-2]} {last}"
    if len(path) >= 2 and path[-2] == "resources":
        return f"pool {last!r}: count"
    return last


def _problem(error: jsonschema.ValidationError) -> str:
    path, keyword, value, schema = list(error.absolute_path), error.validator, error.instance, error.schema
    label = _label(path)
    if keyword == "additionalProperties" and isinstance(value, dict) and "properties" in schema:
        valid = tuple(schema["properties"])
        extra = next(name for name in value if name not in valid)
        if schema is TASK and extra in STEP["properties"]:  # a step's walk: a par task has none
            return (f"{as_written(extra)} is a field of a pipeline's steps, not of a par task (tasks run side by side, "
                    f"each once; write a pipeline for {as_written(extra)})")
        hint = did_you_mean(str(extra), valid, otherwise=f" (valid: {', '.join(valid)})")
        return f"unknown field {as_written(extra)} in {_object(schema, label)}{hint}"
    if keyword == "required":
        missing = next(name for name in error.validator_value if name not in value)
        return f"{_object(schema, label)} has no {missing!r}"
    if keyword == "oneOf" and "command" in schema.get("properties", {}):
        return ("give exactly one of 'command' (a shell command), 'python' (module:function) "
                "or 'prompt' (for the agent)")
    if keyword == "dependentRequired":
        field = next(name for name, needs in error.validator_value.items()
                     if name in value and any(need not in value for need in needs))
        return f"{field} is only for prompt steps (it is passed to the agent)"
    if "propertyNames" in error.schema_path:
        return f"{_name_owner(path)} name {as_written(value)} is not {schema.get('title', 'valid')}"
    if path and path[-1] in ("id", "name") and keyword in ("type", "pattern", "minLength", "maxLength", "not"):
        what = "pipeline name" if path[-1] == "name" else "task id" if path == ["id"] else "step id"
        if keyword == "maxLength":
            return f"{what} {as_written(value)} is longer than {MAX_NAME_LENGTH} characters"
        if keyword == "not":
            why = "the run's shared folder" if value == SHARED_DIR else "the engine writes that folder in the results folder"
            return f"{what} {value!r} is reserved ({why})"
        return f"{what} {as_written(value)} is malformed: {NAME_RULE}"
    if keyword == "uniqueItems":
        return f"{label} lists an entry twice: {as_written(value)}"
    title = schema.get("title") or keyword
    if keyword == "type" and label.startswith("a "):
        return f"{label} must be {title}, got {json_type(value)}"
    if schema.get("type") == "boolean" and isinstance(value, str) and value.lower() in ("yes", "no", "on", "off"):
        return f"{label} must be {title}, got {as_written(value)} (a word in YAML 1.2, which YAML 1.1 made a boolean)"
    return f"{label} must be {title}, got {as_written(value)}"


def _object(schema: Dict[str, Any], label: str) -> str:
    """'a step', 'a pipeline', 'a mount' or 'the file': the object an error is about."""
    fields = schema.get("properties", {})
    if schema.get("title", "").startswith("a task"):
        return "a task"
    for field, what in (("command", "a step"), ("steps", "a pipeline"), ("host_path", "a mount")):
        if field in fields:
            return what
    return "the file (it holds 'pipelines')" if "pipelines" in fields else label


def _name_owner(path: List[Any]) -> str:
    parent = path[-1] if path else ""
    return {"resources": "pool", "env": "env", "matrix": "matrix"}.get(parent, str(parent))


def check_matrix(matrix: Any) -> Optional[str]:
    """The problem with a ``matrix`` field, or None."""
    found = first_error("matrix", {"matrix": matrix})
    if found is None:
        return None
    return found[1]
