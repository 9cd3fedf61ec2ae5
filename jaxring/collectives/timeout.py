"""How long a collective waits for missing ranks or processes: the one owner of that setting.

Every jaxring collective (the in-jit rings, the cross-process agreement and
exchange, broadcast and the replica checks) takes `timeout=` in seconds or
falls back to the default here: `set_default_timeout`, else
$JAXRING_TIMEOUT_S (read once, at the first collective), else 300 s.
`float("inf")` means wait forever.
"""

import math
import numbers
import os
import re
import sys

from jaxring.collectives import _ffi

ENV = "JAXRING_TIMEOUT_S"
FALLBACK_S = 300.0

_default_s = None  # set by set_default_timeout or, on first use, from ENV


def check(seconds, name: str = "timeout") -> float:
    """`seconds` as a float, if it is a positive real number (inf included); else a clear error."""
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise TypeError(
            f"{name} must be a positive number of seconds (float('inf') waits forever), "
            f"got {seconds!r} of type {type(seconds).__name__}"
        )
    if not seconds > 0:  # also refuses nan
        raise ValueError(
            f"{name} must be a positive number of seconds (float('inf') waits forever), got {seconds!r}"
        )
    return float(seconds)


def _from_environment() -> float:
    value = os.environ.get(ENV, "").strip()
    if not value:
        return FALLBACK_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise ValueError(
            f"${ENV} must be a positive number of seconds ('inf' waits forever), got {value!r}; "
            f"fix or unset it ({FALLBACK_S:g} s when unset)"
        )
    return seconds


def default_timeout() -> float:
    """Seconds a collective called without `timeout=` waits (inf: forever)."""
    global _default_s
    if _default_s is None:
        _default_s = _from_environment()
        _push_to_handlers(_default_s)
    return _default_s


def set_default_timeout(seconds: float) -> None:
    """Seconds every later collective called without `timeout=` waits; float('inf') waits forever.

    Applies to programs already compiled too: the ring handlers read the
    default when they run.
    """
    global _default_s
    _default_s = check(seconds)
    _push_to_handlers(_default_s)


def resolve(timeout: float | None) -> float:
    """The seconds to wait: `timeout` if given (checked), else the default."""
    return default_timeout() if timeout is None else check(timeout)


# Compiled handler modules loaded on demand (the MPI leg), besides the CPU and CUDA rings.
_other_modules = []


def add_handler_module(module) -> None:
    """Hands the default to `module`'s handlers now and at every later change."""
    _other_modules.append(module)
    module.set_default_timeout_s(default_timeout())


def _push_to_handlers(seconds: float) -> None:
    for module in (_ffi.cpu_module(), _ffi.cuda_module(), *_other_modules):
        if module is not None:
            module.set_default_timeout_s(seconds)


# XLA prefixes a failed execution's error once more for every execution queued
# behind it (each waited on the one before): dozens of times in a training loop.
_DISPATCH_PREFIXES = re.compile(r"(?:Error dispatching computation: )+")


def runtime_error_text(error: BaseException) -> str:
    """The message of a JAX runtime error, said once: without XLA's repeated dispatch prefixes."""
    return _DISPATCH_PREFIXES.sub("", str(error))


def _report_runtime_errors_once(previous_hook):
    """An uncaught-exception hook that shows a JAX runtime error's message once: a collective's
    timeout (which names the op, the ranks and the likely cause) reaches a loop of queued steps
    behind one "Error dispatching computation: " per step queued after the one that timed out."""

    def hook(kind, error, trace):
        text = runtime_error_text(error)
        if isinstance(error, RuntimeError) and text != str(error):
            shortened = kind(text)
            shortened.__cause__, shortened.__context__ = error.__cause__, error.__context__
            shortened.__suppress_context__ = error.__suppress_context__
            error = shortened.with_traceback(trace)
        previous_hook(kind, error, trace)

    return hook


# A library user's loop (no train.py, which says its errors in one line) sees the timeout this way.
sys.excepthook = _report_runtime_errors_once(sys.excepthook)
