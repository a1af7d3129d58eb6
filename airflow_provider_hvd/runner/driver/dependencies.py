"""Which top-level modules a call needs on the workers, as far as the driver can tell.

Two sources, both cheap: the modules the pickled call refers to by name (functions,
classes and modules cloudpickle pickles by reference, e.g. a tensor in the kwargs or a
helper from the user's own package), and the ``import`` statements inside the training
function's code (the HorovodRunner idiom: ``import horovod.torch as hvd`` as its first
line), except those inside a ``try`` (an optional import) or ``with`` block. The barrier
tasks look each one up with ``importlib.util.find_spec`` before a rank starts
(barrier/entry.py), so a module missing on a worker is named in seconds rather than as a
rank's traceback.
"""

from __future__ import annotations

import dis
import importlib.util
import io
import pickletools
import sys
import types
from typing import Any, Callable

# The runner's ranks import these whatever the function does.
ALWAYS = ("horovod", "cloudpickle")
# Past this many opcodes the rest of a pickle is not scanned (a payload of millions of small
# objects); the rank's own import error stays the fallback.
_MAX_OPS = 100_000
# Opcodes whose argument is a length-prefixed byte or text string: (prefix size, is text). The
# scan skips long ones without reading them: module names are short, tensors are not.
_SIZED = {"SHORT_BINBYTES": (1, False), "BINBYTES": (4, False), "BINBYTES8": (8, False),
          "BYTEARRAY8": (8, False), "SHORT_BINSTRING": (1, True), "BINSTRING": (4, True),
          "SHORT_BINUNICODE": (1, True), "BINUNICODE": (4, True), "BINUNICODE8": (8, True)}
_LONGEST_NAME = 512
_OPCODES = {op.code.encode("latin-1"): op for op in pickletools.opcodes}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}
# cloudpickle pickles a module object as a call of one of these with the module's name.
_MODULE_LOADERS = {"subimport", "dynamic_subimport", "_import_module"}


def required_modules(main: Callable[..., Any], pickled_call: bytes | memoryview) -> list[str]:
    """Sorted top-level module names that must be importable on every worker: not the
    standard library, not ``__main__``, and only names the driver itself can find (an import
    the driver cannot satisfy is the function's own business, not a deployment fault)."""
    names = set(ALWAYS) | pickled_modules(pickled_call) | code_imports(main)
    top = {n.split(".")[0] for n in names if n and not n.startswith(".")}
    top -= set(sys.stdlib_module_names) | {"__main__", "builtins", "__builtin__"}
    return sorted(n for n in top if _found_on_driver(n))


def _found_on_driver(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def pickled_modules(data: bytes | memoryview) -> set[str]:
    """Modules named by GLOBAL/STACK_GLOBAL opcodes, and by cloudpickle's module loaders.

    Walks the opcodes as pickletools.genops does, but steps over long strings instead of
    copying them (genops copies every byte string it meets): a payload carrying a 1 GiB
    array is scanned in microseconds."""
    scan = _OpcodeScan(data)
    try:
        scan.run()
    except Exception:  # a pickle this scan does not understand: the rank-side error remains
        pass
    return scan.found


class _OpcodeScan:
    """One walk over a pickle's opcodes, keeping only what names a module."""

    def __init__(self, data: bytes | memoryview):
        self.found: set[str] = set()
        self.memo: dict[int, Any] = {}
        self.recent: list[Any] = [None, None]  # the last two values pushed, where they are strings
        self.want_module = False  # the next string names the module a cloudpickle loader loads
        self.view = memoryview(data).cast("B")
        self.window = io.BytesIO()  # other arguments are short: parsed from a small copy
        self.pos = 0

    def run(self) -> None:
        for _ in range(_MAX_OPS):
            op = _OPCODES[bytes(self.view[self.pos:self.pos + 1])]
            self.pos += 1
            if op.name == "STOP":
                return
            value, pushed = self._step(op)
            if pushed:
                self.recent = [self.recent[-1], value]

    def _step(self, op) -> tuple[Any, bool]:
        """This opcode's string value (or None), and whether it pushed a value (memo puts do not)."""
        if op.name in _SIZED:
            return self._sized(op.name), True
        if op.arg is not None:
            return self._with_argument(op)
        if op.name == "MEMOIZE":
            self.memo[len(self.memo)] = self.recent[-1]
            return None, False
        if op.name == "STACK_GLOBAL":
            module, qualname = self.recent
            if isinstance(module, str) and isinstance(qualname, str):
                self.want_module = _note_global(self.found, module, qualname)
        return None, True

    def _sized(self, name: str) -> str | None:
        width, text = _SIZED[name]
        size = int.from_bytes(self.view[self.pos:self.pos + width], "little", signed=name == "BINSTRING")
        self.pos += width
        value = None
        if text and size <= _LONGEST_NAME:
            value = str(self.view[self.pos:self.pos + size], "utf-8" if "UNICODE" in name else "latin-1", "replace")
        self.pos += size
        self._maybe_module(value)
        return value

    def _with_argument(self, op) -> tuple[Any, bool]:
        self.window.seek(0)
        self.window.truncate()
        self.window.write(self.view[self.pos:self.pos + 4096])
        self.window.seek(0)
        arg = op.arg.reader(self.window)
        self.pos += self.window.tell()
        if op.name in _GET_OPS:
            value = self.memo.get(arg)
            self._maybe_module(value)
            return value, True
        if op.name in _PUT_OPS:
            self.memo[arg] = self.recent[-1]
            return None, False
        if op.name in ("GLOBAL", "INST"):
            module, _, qualname = str(arg).partition(" ")
            self.want_module = _note_global(self.found, module, qualname)
        return None, True

    def _maybe_module(self, value: Any) -> None:
        if self.want_module and isinstance(value, str):
            self.found.add(value)
            self.want_module = False


def _note_global(found: set[str], module: str, qualname: str) -> bool:
    """Record a referenced module; True when the global loads a module named by the next string."""
    if qualname in _MODULE_LOADERS and "cloudpickle" in module:
        return True
    found.add(module)
    return False


def code_imports(main: Callable[..., Any]) -> set[str]:
    """Absolute imports in the function's code, its nested functions and the functions of its own
    module it calls (those travel by value with it), outside ``try``/``with`` blocks (Python marks
    both with the same exception table: an optional import is never required)."""
    fn = getattr(main, "__func__", main)
    if getattr(fn, "__code__", None) is None and callable(fn):  # a functools.partial, an object with __call__
        fn = getattr(fn, "func", None) or getattr(type(fn), "__call__", None)
    found: set[str] = set()
    seen: set[int] = set()
    todo = [fn] if getattr(fn, "__code__", None) is not None else []
    while todo and len(seen) < 200:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        names = _scan_code(fn.__code__, found)
        module_globals = getattr(fn, "__globals__", {})
        for name in names:
            helper = module_globals.get(name)
            if isinstance(helper, types.FunctionType) and helper.__module__ == fn.__module__:
                todo.append(helper)
    return found


def _scan_code(code: types.CodeType, found: set[str]) -> set[str]:
    """Add the code's unguarded absolute imports to ``found``; return the global names it uses."""
    bytecode = dis.Bytecode(code)
    names = set(code.co_names)
    guarded = [(e.start, e.end) for e in getattr(bytecode, "exception_entries", ())]
    level = 0
    for instr in bytecode:
        if instr.opname == "LOAD_CONST" and isinstance(instr.argval, int):
            level = instr.argval  # IMPORT_NAME's level is the last int constant loaded before it
        elif instr.opname == "IMPORT_NAME":
            if level == 0 and not any(start <= instr.offset < end for start, end in guarded):
                found.add(instr.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _scan_code(const, found)
    return names
