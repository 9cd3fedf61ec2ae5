"""Run under mpirun by test_sharded_step.py: the toy run of SHARDED_CONFIG in WORKDIR with train.shard_optimizer,
after jaxring.ShardedUpdate(processes=True) in a pmap loop beside the replicated update (library_steps), and
before the run's first steps with train.allreduce_dtype bfloat16, replicated and sharded (wire_steps), the same
run resumed in WORKDIR/../resumed (a copy of another shape's run, stopped at a checkpoint) and FLOAT16_CONFIG's
steps sharded (float16_steps).

    mpirun -np P python -m mpi4py sharded_worker.py WORKDIR
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxring  # noqa: E402
from toy_task import (FLOAT16_CONFIG, SHARDED_CONFIG, WIRE_STEPS, LoudTask, ToyTask, toy_config,  # noqa: E402
                       with_train)

from jaxring.engine.trainer import Trainer  # noqa: E402

SHAPES = {"w": (13, 7), "b": (5,), "v": (40, 9)}  # 91 + 5 + 360 floats: every bucket padded to 4 blocks


def library_steps(rank: int) -> dict:
    """ShardedUpdate over every device of every process (wire_dtype bfloat16 across them) and the replicated
    update (jaxring.allreduce's mean in the same wire_dtype, then optax's whole update), 4 queued steps each
    of sgd at rate 1 and of adamw; the gradients differ per device and process, the weights start alike."""
    devices = jax.local_device_count()
    start = {k: np.random.default_rng(1).standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    params = jax.tree.map(lambda a: np.stack([a] * devices), start)
    rng = np.random.default_rng(100 + rank)
    grads = [{k: rng.standard_normal((devices, *s)).astype(np.float32) * 3 for k, s in SHAPES.items()}
             for _ in range(4)]
    out = {}
    for name, optimizer in {"sgd": optax.sgd(1.0), "adamw": optax.adamw(0.05, weight_decay=0.1)}.items():
        sharded = jaxring.ShardedUpdate(optimizer, "d", bucket_bytes=64, processes=True, wire_dtype="bfloat16")

        def both(p, *gs):
            s, q, r = sharded.init(p), p, optimizer.init(p)
            for g in gs:
                p, s, _, _ = sharded.update(g, s, p)
                updates, r = optimizer.update(jaxring.allreduce(g, "d", op="mean", processes=True,
                                                                wire_dtype="bfloat16"), r, q)
                q = optax.apply_updates(q, updates)
            return p, q, s

        ours, theirs, state = jax.pmap(both, axis_name="d")(params, *grads)
        for key in SHAPES:
            out[f"{name}_ours_{key}"], out[f"{name}_theirs_{key}"] = np.asarray(ours[key]), np.asarray(theirs[key])
        if name == "adamw":
            out["adamw_block_sizes"] = np.array([np.asarray(x).shape[-1] for x in jax.tree.leaves(state[0].mu)])
    return out


def wire_steps(world, folder: Path) -> None:
    """SHARDED_CONFIG's first WIRE_STEPS queued steps with the gradients crossing processes in bfloat16, replicated
    and sharded: rank 0 writes each run's weights to FOLDER/wire_{replicated,sharded}.npz."""
    for shard in (False, True):
        config = toy_config(**with_train(SHARDED_CONFIG, shard_optimizer=shard, allreduce_dtype="bfloat16"))
        trainer = Trainer(ToyTask(), config, folder / "unused", world)
        state = trainer.on_devices(trainer.init_state())
        for _, batch in zip(range(WIRE_STEPS), trainer.batches):
            state, _ = trainer.train_step(state, batch)
        params = trainer.on_host(state).params  # collective under shard_optimizer
        if world.rank == 0:
            np.savez(folder / f"wire_{'sharded' if shard else 'replicated'}.npz", **params)


def float16_steps(world, folder: Path) -> None:
    """FLOAT16_CONFIG's queued steps sharded over every device of every process: each process writes its devices'
    gradient norms at every step (not finite at a skipped one), final weights and loss scale to
    FOLDER/float16_rank{rank}.npz, one row per device."""
    config = toy_config(**with_train(FLOAT16_CONFIG, shard_optimizer=True))
    trainer = Trainer(LoudTask(), config, folder / "unused", world)
    state = trainer.on_devices(trainer.init_state())
    norms = []
    for _, batch in zip(range(config.train.max_steps), trainer.batches):
        state, metrics = trainer.train_step(state, batch)
        norms.append(np.asarray(metrics["grad_norm"]))
    np.savez(folder / f"float16_rank{world.rank}.npz", norms=np.stack(norms), scale=np.asarray(state.loss_scale.scale),
             good_steps=np.asarray(state.loss_scale.good_steps),
             **{key: np.asarray(leaf) for key, leaf in state.params.items()})


world = jaxring.init()
np.savez(Path(sys.argv[1]).parent / f"library_rank{world.rank}.npz", **library_steps(world.rank))
config = toy_config(**with_train(SHARDED_CONFIG, shard_optimizer=True))
Trainer(ToyTask(), config, Path(sys.argv[1]), world).fit()
wire_steps(world, Path(sys.argv[1]).parent)
Trainer(ToyTask(), config, Path(sys.argv[1]).parent / "resumed", world).fit(resume=True)
float16_steps(world, Path(sys.argv[1]).parent)
