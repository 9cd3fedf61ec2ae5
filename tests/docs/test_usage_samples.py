"""docs/USAGE.md's and README.md's Python samples, run as written: under pmap, shard_map with a
gradient, the multi-process one alone and under mpirun, and the jax.distributed one alone and
under mpirun."""

import os
import subprocess
import sys

import pytest

from tests.docs.markdown import blocks
from tests.tiny_runs import finish, mpirun

USAGE = blocks("docs/USAGE.md", "python")
README = blocks("README.md", "python")


def run_alone(tmp_path, code, devices=8):
    path = tmp_path / "sample.py"
    path.write_text(code)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)


def test_the_docs_have_the_samples_this_file_runs():
    assert len(USAGE) == 4 and len(README) == 1
    assert "jax.pmap" in USAGE[0] and "jax.shard_map" in USAGE[1] and "jax.set_mesh" in USAGE[1]
    assert "processes=True" in USAGE[2]
    assert "jaxring.initialize_jax_distributed()" in USAGE[3]


@pytest.mark.parametrize("code", [*USAGE, *README], ids=["pmap", "shard_map_grad", "processes", "distributed", "readme"])
def test_a_sample_runs_as_written(tmp_path, code):
    finished = run_alone(tmp_path, code)
    assert finished.returncode == 0, finished.stderr[-3000:]


def test_the_shard_map_gradient_needs_the_mesh_context_the_docs_name(tmp_path):
    """USAGE.md says why jax.set_mesh is there: without it JAX refuses the gradient."""
    without = USAGE[1].replace("with jax.set_mesh(mesh):\n    grad", "if True:\n    grad")
    assert without != USAGE[1]
    finished = run_alone(tmp_path, without)
    assert finished.returncode != 0 and "jax.set_mesh" in finished.stderr


def test_the_multi_process_sample_under_mpirun(tmp_path):
    (tmp_path / "sgd.py").write_text(USAGE[2])
    code, output = finish(mpirun(2, [tmp_path / "sgd.py"], with_mpi4py=True), timeout_s=200)
    assert code == 0, output


def test_the_jax_distributed_sample_under_mpirun(tmp_path):
    """Printing what the sample computed: 2 processes x 2 devices, each row of ones, sum 4."""
    (tmp_path / "global.py").write_text(USAGE[3] + "\nprint('total', total.addressable_shards[0].data.tolist())\n")
    code, output = finish(mpirun(2, [tmp_path / "global.py"], with_mpi4py=True), timeout_s=200)
    assert code == 0, output
    assert output.count("total [[4.0, 4.0, 4.0]]") == 2, output
