"""The handlers' workspace: one layout (csrc/core/ring_handler_common.h), sized from Python with it,
and refused with a clear error when XLA hands a handler another size."""

import jax
import numpy as np
import pytest

import jaxring
from jaxring.collectives import _ffi, _ring_call

MODES = _ffi.modes()


@pytest.mark.parametrize("elements", [0, 1, 1001])
def test_layout_by_mode_and_type(elements):
    layout = _ffi.cpu_module().workspace
    slice_bytes = 4 << 20
    # all-reduce keeps partial sums in its output where they have its type; 16-bit floats need float32 ones.
    for dtype in ("float32", "int32", "int8", "uint16", "float64", "int64", "bool"):
        assert layout(MODES["allreduce"], dtype, elements, slice_bytes, False)[0] == 0
    assert layout(MODES["allreduce"], "bfloat16", elements, slice_bytes, False) == (elements, "float32")
    assert layout(MODES["allreduce"], "float16", elements, slice_bytes, False) == (elements, "float32")
    # reduce_scatter's output is one chunk: the partial sums need a full buffer, of components for complex numbers.
    assert layout(MODES["reduce_scatter"], "float32", elements, slice_bytes, False) == (elements, "float32")
    assert layout(MODES["reduce_scatter"], "int8", elements, slice_bytes, False) == (elements, "int8")
    assert layout(MODES["reduce_scatter"], "complex64", elements, slice_bytes, False) == (2 * elements, "float32")
    assert layout(MODES["reduce_scatter"], "complex128", elements, slice_bytes, False) == (2 * elements, "float64")
    assert layout(MODES["all_gather"], "bfloat16", elements, slice_bytes, False)[0] == 0
    # CUDA adds one staging slice, in elements of the component type.
    assert layout(MODES["allreduce"], "float32", elements, slice_bytes, True)[0] == slice_bytes // 4
    assert layout(MODES["reduce_scatter"], "bfloat16", elements, 1000, True)[0] == elements + 500
    assert layout(MODES["allreduce"], "float64", elements, 1000, True)[0] == 125


def test_an_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match=r"the ring takes float32, .*bool, not float8_e4m3fn"):
        _ffi.cpu_module().workspace(MODES["allreduce"], "float8_e4m3fn", 8, 4 << 20, False)


def test_a_workspace_of_the_wrong_size_is_refused(monkeypatch):
    right = _ring_call.workspace
    monkeypatch.setattr(_ring_call, "workspace", lambda *args: right(*args).update(shape=(right(*args).shape[0] + 3,)))
    x = np.arange(2 * 1001, dtype=np.float32).reshape(2, 1001) + 0.5
    f = jax.pmap(lambda v: jaxring.allreduce(v, "i"), axis_name="i", devices=jax.devices()[:2])
    with pytest.raises(Exception, match=r"the workspace has 3 elements but this call needs 0 \(partial sums 0 \+ "
                                        r"staging 0\).*rebuild the package"):
        np.asarray(f(x))
