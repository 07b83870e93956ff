"""The JSON and YAML files users write: a pipeline definition, a sweep's --grid, --points and --space.

One reader for all of them, so that a file means the same, and fails the same, whichever command
reads it:
- at most a limit's worth is read: ``/dev/zero`` or a wrong, huge file does not fill the memory;
- a named pipe with no writer is waited on for a bounded time, not for ever (an ``open`` of one
  blocks, through stop signals too); an anonymous one (``<(generate)``) as long as its writer lives;
- UTF-8; JSON, or YAML for ``.yaml``/``.yml`` (with PyYAML);
- a key given twice in one object is refused, in JSON and YAML: the later one would silently win (the
  keys of a YAML merge, ``<<: *base``, are defaults the object's own override, as YAML says);
- YAML's aliases (``*name``) may repeat a list or mapping, but not so often that the values they
  stand for, written out, would fill the memory (a few hundred bytes of aliases of aliases stand
  for billions), nor inside itself (``&a [*a]``, which no JSON value is);
- YAML's plain values are YAML 1.2's (its core schema), as JSON reads the same text: ``1e-3`` is a
  number (PyYAML, a YAML 1.1 reader, made it the string "1e-3", and a learning rate written so
  reached the user's code as text); ``yes``, ``no``, ``on`` and ``off`` are words, not booleans;
  ``010`` is ten, not eight; ``1:30`` is text, not ninety; ``2024-01-01`` is text, not a date.

Callers say how the file is named in messages (``shown``) and catch the ``OSError`` of a file that
cannot be opened, to say it in their own words; every other problem is a one-line
:class:`common.errors.UsageError`.
"""
from __future__ import annotations

import json
import os
import re
import select
import stat
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

from .errors import UsageError

#: how long a named pipe (a FIFO) waits for its first bytes: one nobody writes to would otherwise
#: wait for ever. A pipe that was given its writer, or a FIFO once its writer came, waits as long
#: as that writer lives.
PIPE_WAIT_SECONDS = 60.0
#: the most values YAML's aliases may add to a file's own once written out (every reader of the file
#: writes them out: a sweep's items, a definition's steps, the results)
MAX_ALIASED_VALUES = 1_000_000


def read_text(path: Path, limit: int, shown: str, what: str) -> str:
    """The file's text: at most ``limit`` bytes (past it: "not ``what``"), for a FIFO in the time
    its writer takes to come. Raises OSError where the file cannot be opened or read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO without a writer: no wait in open
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory")
        waits = stat.S_ISFIFO(mode) and not os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")  # named
        if not waits:
            os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= limit:
            if waits and not select.select([fd], [], [], PIPE_WAIT_SECONDS)[0]:
                raise UsageError(f"{shown}: a named pipe that nothing came through for {PIPE_WAIT_SECONDS:g} s: "
                                 f"nobody writes to it?")
            chunk = os.read(fd, 1 << 20)
            if chunk and waits:  # its writer came: read on, as long as it lives
                waits = False
                os.set_blocking(fd, True)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        else:
            raise UsageError(f"{shown}: larger than {limit >> 20} MiB: not {what}")
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8").removeprefix("\ufeff")  # a byte-order mark some editors write
    except UnicodeDecodeError as error:
        raise UsageError(f"{shown}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def parse(text: str, path: Path, shown: str) -> Any:
    """``text`` read as YAML where ``path`` ends in .yaml or .yml, else as JSON."""
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise UsageError(f"{shown}: YAML needs PyYAML (pip install 'multinode-gpu[yaml]'), or write JSON") from None
        try:
            value = yaml.load(text, Loader=_yaml_loader(yaml))  # noqa: S506 -- a SafeLoader
            _check_aliases(value, shown)
            return value
        except yaml.YAMLError as error:
            raise UsageError(f"{shown}: not valid YAML: {' '.join(str(error).split())}") from None
        except RecursionError:
            raise UsageError(f"{shown}: not valid YAML: nested too deeply") from None
        except ValueError as error:  # a value PyYAML's constructors cannot make (an integer over the digit limit)
            raise UsageError(f"{shown}: not valid YAML: {' '.join(str(error).split())[:200]}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except ValueError as error:  # JSONDecodeError, a duplicate key, or an integer over Python's digit limit
        raise UsageError(f"{shown}: not valid JSON: {' '.join(str(error).split())[:300]}") from None
    except RecursionError:
        raise UsageError(f"{shown}: not valid JSON: nested too deeply") from None


#: a text counts as one value per this many characters: an alias of a long one repeats all of it
TEXT_CHARACTERS_PER_VALUE = 64


def _weight(value: Any) -> int:
    return 1 + len(value) // TEXT_CHARACTERS_PER_VALUE if isinstance(value, str) else 1


def _check_aliases(root: Any, shown: str) -> None:
    """Refuse a document whose aliases stand for more than ``MAX_ALIASED_VALUES`` values beyond its
    own once written out (a text counting one per ``TEXT_CHARACTERS_PER_VALUE`` characters: an
    alias of a megabyte's text repeats a megabyte), or that holds itself. Each list and mapping is
    counted once (depth first, without recursion: a file may be nested thousands deep), with the
    written-out size of each (Python's integers do not overflow: a billion-fold alias costs nothing
    to count)."""
    written: Dict[int, int] = {}  # id of a list or mapping -> its values written out, itself included
    distinct = 0  # the values the file itself holds: each list, mapping and their own texts once
    on_path: Set[int] = set()  # the lists and mappings being counted, from the root down
    texts: Set[int] = set()  # the long texts counted in ``distinct``
    stack: List[Tuple[Any, bool]] = [(root, False)] if isinstance(root, (dict, list)) else []
    while stack:
        node, counted = stack.pop()
        children = list(node.values()) if isinstance(node, dict) else node
        keys = sum(_weight(key) for key in node) if isinstance(node, dict) else 0
        if counted:
            on_path.discard(id(node))
            written[id(node)] = 1 + keys + sum(written[id(child)] if isinstance(child, (dict, list)) else _weight(child)
                                               for child in children)
            continue
        if id(node) in written:
            continue
        on_path.add(id(node))
        for child in children:  # a long text once, however often an alias names it (short ones: each time,
            if isinstance(child, str) and len(child) >= TEXT_CHARACTERS_PER_VALUE:  # as Python shares "a")
                if id(child) not in texts:
                    texts.add(id(child))
                    distinct += _weight(child)
            elif not isinstance(child, (dict, list)):
                distinct += _weight(child)
        distinct += 1 + keys
        stack.append((node, True))
        for child in children:
            if isinstance(child, (dict, list)) and id(child) not in written:
                if id(child) in on_path:
                    raise UsageError(f"{shown}: a list or mapping that contains itself (an alias *name used "
                                     f"inside what it names)")
                stack.append((child, False))
    if written.get(id(root), 0) > distinct + MAX_ALIASED_VALUES:
        raise UsageError(f"{shown}: its aliases (*name) stand for more than {MAX_ALIASED_VALUES:,} values once "
                         f"written out: repeat less, or write the repeated part out once")


def _key(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 62 else f"{text[:60]}... ({len(text)} characters)"


def _unique_keys(pairs: List[Tuple[Any, Any]]) -> Dict[Any, Any]:
    """A JSON object, refusing a key given twice (the last one would silently win)."""
    found: Dict[Any, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"duplicate key {_key(key)} in an object (the later one would silently win)")
        found[key] = value
    return found


#: YAML 1.2's plain booleans, integers and floats (its core schema), as JSON reads the same text.
#: PyYAML, a YAML 1.1 reader, also made booleans of yes/no/on/off (a grid's ``[no, se]`` of country
#: codes became ``[False, "se"]``), octal of a leading zero (``010`` was 8), base 60 of colons
#: (``1:30`` was 90, ``1:30.5`` 90.5), and text of an exponent without a dot (``1e-3``, a learning rate
#: that reached the user's code as a string). Single underscores between digits (``1_000``) stay a
#: number, as PyYAML and Python read them.
_CORE_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_CORE_INT = re.compile(r"^(?:[-+]?[0-9]+(?:_[0-9]+)*|0o[0-7]+|0x[0-9a-fA-F]+)$")
_CORE_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                         r"|\.(?:nan|NaN|NAN))$")
_BOOL_TAG, _INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
#: YAML's merge key, ``<<``, which SafeLoader resolves (flatten_mapping) before it makes the keys
_MERGE_TAG = "tag:yaml.org,2002:merge"
#: YAML 1.1's other implicit types, which YAML 1.2 and JSON read as text: dates (2024-01-01 became a
#: datetime.date, which no JSON value is) and "=" (a value key, which PyYAML cannot even construct)
_TEXT_IN_1_2 = ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value")


def _core_int(loader: Any, node: Any) -> int:
    """A plain integer as YAML 1.2 reads it; one tagged !!int in another form (0b11) as PyYAML does."""
    text = loader.construct_scalar(node)
    base = {"0o": 8, "0x": 16}.get(text[:2], 10)
    try:
        return int(text[2:] if base != 10 else text, base)
    except ValueError:
        import yaml

        return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)


def _yaml_loader(yaml: Any) -> type:
    """PyYAML's SafeLoader, refusing a key given twice in one mapping, with YAML 1.2's plain numbers
    and booleans: 1e-3 a number, yes/no/on/off words, 010 ten."""

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:  # "<<: *base": its keys are the defaults the others override
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {_key(key)} (the later one would silently win)", key_node.start_mark)
            return super().construct_mapping(node, deep)

    replaced = (_BOOL_TAG, _INT_TAG, _FLOAT_TAG, *_TEXT_IN_1_2)
    Loader.yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag not in replaced]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver(_BOOL_TAG, _CORE_BOOL, list("tTfF"))
    Loader.add_implicit_resolver(_INT_TAG, _CORE_INT, list("-+0123456789"))  # before the floats: 5 is an int
    Loader.add_implicit_resolver(_FLOAT_TAG, _CORE_FLOAT, list("-+0123456789."))
    Loader.add_constructor(_INT_TAG, _core_int)
    return Loader
