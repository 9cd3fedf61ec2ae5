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
    layout = _ffi.cpu_module().workspace_elements
    slice_bytes = 4 << 20
    # all-reduce keeps float32/int32 partial sums in its output; 16-bit types need float32 ones.
    assert layout(MODES["allreduce"], 4, elements, slice_bytes, False) == 0
    assert layout(MODES["allreduce"], 2, elements, slice_bytes, False) == elements
    # reduce_scatter's output is one chunk: the partial sums need a full buffer.
    assert layout(MODES["reduce_scatter"], 4, elements, slice_bytes, False) == elements
    assert layout(MODES["all_gather"], 2, elements, slice_bytes, False) == 0
    # CUDA adds one staging slice, in elements of the input type.
    assert layout(MODES["allreduce"], 4, elements, slice_bytes, True) == slice_bytes // 4
    assert layout(MODES["reduce_scatter"], 2, elements, 1000, True) == elements + 500


def test_a_workspace_of_the_wrong_size_is_refused(monkeypatch):
    right = _ring_call.workspace_elements
    monkeypatch.setattr(_ring_call, "workspace_elements", lambda *args: right(*args) + 3)
    x = np.arange(2 * 1001, dtype=np.float32).reshape(2, 1001) + 0.5
    f = jax.pmap(lambda v: jaxring.allreduce(v, "i"), axis_name="i", devices=jax.devices()[:2])
    with pytest.raises(Exception, match=r"the workspace has 3 elements but this call needs 0 \(partial sums 0 \+ "
                                        r"staging 0\).*rebuild the package"):
        np.asarray(f(x))
