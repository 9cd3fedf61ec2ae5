"""Loads the compiled ring handlers and registers them with XLA."""

import functools

import jax

TARGET = "jaxring_ring"


@functools.cache
def cpu_module():
    try:
        from jaxring.collectives import _jaxring_cpu
    except ImportError as e:
        raise ImportError(
            "jaxring's compiled CPU handlers are missing: install the package "
            "(`make test` or `pip install --no-build-isolation -e .`) instead of "
            "importing it from a source tree that was never built"
        ) from e
    return _jaxring_cpu


@functools.cache
def cuda_module():
    """The CUDA handlers, or None when the package was built without a CUDA toolkit."""
    try:
        from jaxring.collectives import _jaxring_cuda
    except ImportError:
        return None
    return _jaxring_cuda


@functools.cache
def register():
    """Registers every compiled target once per process; returns the platforms."""
    platforms = []
    for platform, module in (("cpu", cpu_module()), ("CUDA", cuda_module())):
        if module is None:
            continue
        for name, capsule in module.registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
        platforms.append(platform)
    return tuple(platforms)


def set_default_timeout(seconds: float) -> None:
    """Seconds every later collective waits for missing ranks before failing."""
    if not seconds > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {seconds!r}")
    for module in (cpu_module(), cuda_module()):
        if module is not None:
            module.set_default_timeout_s(float(seconds))


def default_timeout() -> float:
    return cpu_module().default_timeout_s()
