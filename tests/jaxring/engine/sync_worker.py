"""Run under mpirun by test_sync.py: Sync.mean over every device of every process, printed for the test to check.

Each process draws its devices' leaves from a generator seeded by its rank
and prints, per method, the mean its first device holds; the test compares
them with float64 numpy over every process's draws.
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxring  # noqa: E402
from test_sync import random_tree  # noqa: E402

from jaxring.engine import sync as sync_lib  # noqa: E402
from jaxring.engine.task import AXIS  # noqa: E402

world = jaxring.init()
tree = random_tree(np.random.default_rng(world.rank), len(world.local_devices))
for label in sys.argv[1:]:  # a method, or METHOD:WIRE_DTYPE (train.allreduce_dtype)
    method, _, wire_dtype = label.partition(":")
    sync = sync_lib.make_sync(world.size, method, bucket_bytes=64, wire_dtype=wire_dtype or None)
    mean = jax.pmap(sync.mean, axis_name=AXIS, devices=world.local_devices)
    legs = [line for line in mean.lower(tree).as_text().splitlines() if "jaxring_mpi_ring" in line]
    wire = "bf16" if wire_dtype == "bfloat16" else "f32"
    assert legs and all(re.search(rf"tensor<\d+x{wire}>", line) for line in legs), (label, legs)  # what crosses
    out = mean(tree)
    for key in sorted(out):
        rows = np.asarray(out[key], np.float64)
        assert all(np.array_equal(row, rows[0]) for row in rows), (label, key)  # every local device holds the same
        print(f"rank {world.rank} {label} {key} {rows[0].ravel().tolist()}", flush=True)
