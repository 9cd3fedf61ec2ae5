def registrations() -> dict: ...

TARGET_NAME: str = 'jaxring_ring'

MODES: dict = ...

def schedule(arg0: int, arg1: int, arg2: int, arg3: int, arg4: int, arg5: int, /) -> list[tuple[int, bool, int, int, int, int, int]]:
    """
    Stages of one rank: (kind, left_is_input, src, dst, count, wait_left, wait_right).
    """

REDUCTIONS: dict = {'sum' : 0, 'max' : 1, 'min' : 2}

ELEMENT_TYPES: list = ...

def workspace(mode: int, dtype: str, elements: int, slice_bytes: int, staging_slice: bool) -> tuple[int, str]:
    """
    (elements, dtype name) of the workspace a call on `elements` of `dtype` needs (ring_handler_common.h's WorkspaceFor).
    """

def runs_in_place(mode: int, ranks: int) -> bool:
    """
    Whether the CPU handler's output aliases its input for this op (cpu_engine.h's RunsInPlace).
    """

CPU_PATHS: dict = ...

def cpu_path() -> int: ...

def set_cpu_path(path: int) -> None:
    """Every later call takes this path (CPU_PATHS); 'auto' chooses by size."""

def cpu_push_max_bytes() -> int:
    """
    Largest buffer (bytes) the CPU engine's 'auto' path takes the push path for (the ring above).
    """

def set_cpu_push_max_bytes(bytes: int) -> None: ...

def default_timeout_s() -> float:
    """
    Seconds a meeting waits for missing ranks (inf: no limit); jaxring/collectives/timeout.py sets it.
    """

def set_default_timeout_s(seconds: float) -> None: ...
