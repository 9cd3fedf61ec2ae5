"""scripts/bench/bench_allreduce_mpi.py's small-message options and its CG-shaped loop, in one process."""

import sys
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import bench_allreduce_mpi  # noqa: E402


def test_the_small_sizes_and_modes_parse():
    args = bench_allreduce_mpi.parse_args(["--sizes", "8", "64", "4K", "64K", "--busy-poll", "--ops-per-program", "201"])
    assert args.sizes == [8, 64, 4 << 10, 64 << 10]
    assert args.busy_poll and args.ops_per_program == 201
    assert bench_allreduce_mpi.polling(args) == "busy"
    assert bench_allreduce_mpi.polling(bench_allreduce_mpi.parse_args([])) == "yield"


def test_the_cg_loop_solves_its_system_in_one_process():
    """With one process the sum across processes is the value itself: plain conjugate gradients on
    (4.5 - the periodic 5-point stencil) x = b, checked against numpy's dense solve in float64."""
    with jax.enable_x64(True):
        side = 7
        b = np.random.default_rng(61).standard_normal((side, side))
        x = np.asarray(jax.jit(lambda v: bench_allreduce_mpi.cg_solve(lambda s: s, v, 60))(b))
    eye = np.eye(side)
    shift = np.roll(eye, 1, axis=1)
    stencil_1d = shift + shift.T
    matrix = 4.5 * np.eye(side * side) - np.kron(stencil_1d, eye) - np.kron(eye, stencil_1d)
    np.testing.assert_allclose(x.reshape(-1), np.linalg.solve(matrix, b.reshape(-1)), rtol=1e-9, atol=1e-12)
