"""Loads the compiled ring handlers and registers them with XLA."""

import functools

import jax


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


def target_name() -> str:
    """The FFI target of the ring handlers, as the compiled module names it."""
    return cpu_module().TARGET_NAME


def modes() -> dict:
    """The collective modes the handlers run, name -> the value they take."""
    return dict(cpu_module().MODES)


def reductions() -> dict:
    """The reductions the handlers run ("sum", "max", "min"), name -> the value they take."""
    return dict(cpu_module().REDUCTIONS)


def element_types() -> tuple:
    """numpy's names of the dtypes the ring takes (csrc/core/ring_handler_common.h's kElementTypes)."""
    return tuple(cpu_module().ELEMENT_TYPES)


@functools.cache
def register():
    """Registers every compiled target once per process; returns the platforms.

    Refuses a misspelt JAXRING_CUDA_ENGINE here, at the first collective, rather
    than at the first ring of several GPUs, which a one-GPU job never runs."""
    platforms = []
    for platform, module in (("cpu", cpu_module()), ("CUDA", cuda_module())):
        if module is None:
            continue
        if platform == "CUDA" and (error := module.engine_choice_error()):
            raise ValueError(error)
        for name, capsule in module.registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
        platforms.append(platform)
    return tuple(platforms)
