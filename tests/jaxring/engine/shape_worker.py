"""Run under mpirun by test_resume_shapes.py: the toy run of SHAPE_CONFIG in WORKDIR, straight or resumed.

    mpirun -np P python -m mpi4py shape_worker.py WORKDIR [--resume]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jaxring  # noqa: E402
from toy_task import SHAPE_CONFIG, ToyTask, toy_config  # noqa: E402

from jaxring.engine.trainer import Trainer  # noqa: E402

world = jaxring.init()
Trainer(ToyTask(), toy_config(**SHAPE_CONFIG), Path(sys.argv[1]), world).fit(resume="--resume" in sys.argv)
