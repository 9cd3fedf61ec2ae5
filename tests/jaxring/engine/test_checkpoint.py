"""Checkpoints: round trip, keep last N plus best, atomic writes, shape checks, verification and fallback."""

import hashlib
import json

import flax.serialization
import numpy as np
import optax
import pytest

from jaxring.engine.checkpoint import BEST, LATEST, CheckpointError, Checkpoints, load_variables


def make_state(seed):
    rng = np.random.default_rng(seed)
    params = {"dense": {"kernel": rng.normal(size=(3, 5)).astype(np.float32)}, "bias": rng.normal(size=(7,))}
    return {"params": params, "opt": optax.sgd(0.1, momentum=0.9).init(params), "step": np.int32(seed)}


def assert_equal_trees(a, b):
    import jax

    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(x, y)


def test_round_trip_with_extra(tmp_path):
    ckpt = Checkpoints(tmp_path)
    state = make_state(3)
    extra = {"batches": {"epoch": 2, "order": [3, 1, 2], "seed": 2**70}}
    ckpt.save(10, state, extra)
    restored, got = ckpt.restore(make_state(0))
    assert_equal_trees(restored, state)
    assert got == extra


def test_keeps_last_n_and_the_best(tmp_path):
    ckpt = Checkpoints(tmp_path, keep=2, best_metric="wer")
    wers = {1: 0.9, 2: 0.5, 3: None, 4: 0.7, 5: 0.6, 6: None}
    for step, wer in wers.items():
        ckpt.save(step, make_state(step), {}, None if wer is None else {"wer": wer})
    assert ckpt.steps() == [2, 5, 6]
    assert ckpt.best() == {"step": 2, "metric": "wer", "value": 0.5, "metrics": {"wer": 0.5}}
    assert_equal_trees(ckpt.restore(make_state(0), 2)[0], make_state(2))


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path):
    ckpt = Checkpoints(tmp_path)
    ckpt.save(1, make_state(1), {"at": 1})
    # what a run killed mid-write leaves: a partial temporary file
    (tmp_path / "step_000000002.msgpack.tmp").write_bytes(b"\x85partial")
    reopened = Checkpoints(tmp_path)
    assert reopened.steps() == [1]
    reopened.discard_partial()
    assert not list(tmp_path.glob("*.tmp"))
    assert reopened.restore(make_state(0))[1] == {"at": 1}


def test_clear_errors(tmp_path):
    ckpt = Checkpoints(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.restore(make_state(0))
    ckpt.save(1, make_state(1), {})
    with pytest.raises(FileNotFoundError, match=r"step 7 .*have \[1\]"):
        ckpt.restore(make_state(0), 7)
    wrong = make_state(0)
    wrong["params"]["bias"] = np.zeros(8)
    with pytest.raises(ValueError, match=r"\['params'\]\['bias'\] is float64\[7\] but float64\[8\] is expected"):
        ckpt.restore(wrong)



@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_a_checkpoint_of_another_dtype_is_refused(tmp_path, dtype):
    ckpt = Checkpoints(tmp_path)
    ckpt.save(1, make_state(1), {})  # bias is float64[7]
    wrong = make_state(0)
    wrong["params"]["bias"] = wrong["params"]["bias"].astype(dtype)  # same shape, another dtype
    with pytest.raises(ValueError, match=rf"\['params'\]\['bias'\] is float64\[7\] but {np.dtype(dtype).name}\[7\]"):
        ckpt.restore(wrong)


def damage(path, how, rng):
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(data[: int(rng.integers(1, len(data)))])
    else:  # one bit flipped, anywhere in the file
        position = int(rng.integers(len(data)))
        data[position] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "bit flip"])
@pytest.mark.parametrize("seed", range(4))
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_intact_one_loads(tmp_path, capsys, how, seed):
    ckpt = Checkpoints(tmp_path, keep=3)
    for step in (1, 2, 3):
        ckpt.save(step, make_state(step), {"at": step})
    damage(ckpt.path(3), how, np.random.default_rng(seed))
    restored, extra = ckpt.restore(make_state(0))
    assert extra == {"at": 2}
    assert_equal_trees(restored, make_state(2))
    assert ckpt.read(LATEST).step == 2
    assert f"checkpoint {ckpt.path(3)}" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match=f"checkpoint {ckpt.path(3)} "):
        ckpt.read(3)  # asked for by number: no silent substitute
    with pytest.raises(CheckpointError, match=f"checkpoint {ckpt.path(3)} "):
        ckpt.restore(make_state(0), 3)


def test_every_checkpoint_damaged_is_one_error_naming_each(tmp_path):
    ckpt = Checkpoints(tmp_path, keep=2)
    for step in (1, 2):
        ckpt.save(step, make_state(step), {})
        ckpt.path(step).write_bytes(ckpt.path(step).read_bytes()[:-7])
    with pytest.raises(CheckpointError, match="no intact checkpoint") as error:
        ckpt.read()
    assert str(ckpt.path(1)) in str(error.value) and str(ckpt.path(2)) in str(error.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_state_is_never_written(tmp_path, bad):
    ckpt = Checkpoints(tmp_path, keep=1)
    ckpt.save(1, make_state(1), {})
    state = make_state(2)
    state["params"]["dense"]["kernel"][1, 2] = bad
    with pytest.raises(FloatingPointError, match=r"step 2: \['params'\]\['dense'\]\['kernel'\]"):
        ckpt.save(2, state, {})
    assert ckpt.steps() == [1]  # and the one before is kept, keep=1 notwithstanding


def test_the_best_checkpoint_damaged_falls_back_to_the_newest_intact_one_and_says_which(tmp_path, capsys):
    ckpt = Checkpoints(tmp_path / "checkpoints", keep=1, best_metric="wer")
    for step, wer in ((1, 0.1), (2, 0.9), (3, 0.5)):
        ckpt.save(step, {"params": make_state(step)["params"], "model_state": {}, "step": np.int32(step)}, {},
                  {"wer": wer})
    assert load_variables(tmp_path, "best")[1] == 1 and ckpt.read(BEST).step == 1
    assert load_variables(tmp_path, "latest")[1] == 3 and load_variables(tmp_path, "3")[1] == 3
    ckpt.path(1).write_bytes(ckpt.path(1).read_bytes()[:100])
    variables, step = load_variables(tmp_path, "best")
    assert step == 3  # the step returned is the one whose weights these are, not best.json's
    assert_equal_trees(variables["params"], make_state(3)["params"])
    assert f"checkpoint {ckpt.path(1)} is damaged" in capsys.readouterr().err
    assert ckpt.best()["step"] == 1  # the record is not rewritten: the damage stays visible
    with pytest.raises(CheckpointError, match=f"checkpoint {ckpt.path(1)} is damaged"):
        load_variables(tmp_path, 1)


def test_best_without_a_best_record_is_the_latest_and_a_bad_name_is_an_error(tmp_path):
    ckpt = Checkpoints(tmp_path, keep=2)  # no best metric
    for step in (4, 9):
        ckpt.save(step, make_state(step), {"at": step})
    assert ckpt.read(BEST).extra == {"at": 9} and ckpt.read(BEST).step == 9
    with pytest.raises(ValueError, match="a step number, 'latest' or 'best'; got 'newest'"):
        ckpt.read("newest")


def write_raw_checkpoint(path, state, extra, **wrapper):
    """A checkpoint file built here from flax and hashlib alone, with `wrapper` keys added (not through save)."""
    payload = flax.serialization.msgpack_serialize({"state": state, "extra": json.dumps(extra)})
    wrapped = {"format": 2, "sha256": hashlib.sha256(payload).hexdigest(), "payload": payload, **wrapper}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(flax.serialization.msgpack_serialize(wrapped))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_checkpoint_with_a_matching_digest_is_refused_on_reading(tmp_path, capsys, bad):
    ckpt = Checkpoints(tmp_path, keep=3)
    ckpt.save(1, make_state(1), {"at": 1})
    state = flax.serialization.to_state_dict(make_state(2))
    state["params"]["bias"][3] = bad  # not from save, which refuses it: e.g. written by another tool
    write_raw_checkpoint(ckpt.path(2), state, {"at": 2}, finite=True)  # a wrong "finite" is not trusted
    with pytest.raises(CheckpointError, match=rf"{ckpt.path(2)} holds non-finite values in \['params'\]\['bias'\]"):
        ckpt.read(2)
    assert ckpt.read().extra == {"at": 1}  # LATEST skips it, named
    assert f"{ckpt.path(2)} holds non-finite" in capsys.readouterr().err


def test_a_checkpoint_from_before_the_finite_field_was_dropped_still_loads(tmp_path):
    state = make_state(5)
    write_raw_checkpoint(Checkpoints(tmp_path).path(5), flax.serialization.to_state_dict(state), {"at": 5}, finite=True)
    restored, extra = Checkpoints(tmp_path).restore(make_state(0), 5)
    assert_equal_trees(restored, state)
    assert extra == {"at": 5}
    Checkpoints(tmp_path).save(6, state, {})
    assert "finite" not in flax.serialization.msgpack_restore(Checkpoints(tmp_path).path(6).read_bytes())


def test_the_newest_checkpoint_survives_pruning(tmp_path):
    ckpt = Checkpoints(tmp_path, keep=1, best_metric="wer")
    ckpt.save(1, make_state(1), {}, {"wer": 0.1})  # the best
    ckpt.save(2, make_state(2), {}, {"wer": 0.5})
    ckpt.save(3, make_state(3), {})
    assert ckpt.steps() == [1, 3]


def test_a_best_record_lost_to_a_kill_is_made_again_from_the_checkpoint(tmp_path):
    ckpt = Checkpoints(tmp_path, keep=3, best_metric="wer")
    ckpt.save(1, make_state(1), {}, {"wer": 0.5})
    ckpt.save(2, make_state(2), {}, {"wer": 0.2})
    (tmp_path / "best.json").write_text('{"step": 1, "metric": "wer", "value": 0.5}')  # as if killed before its write
    ckpt.update_best(2, {"wer": 0.2})
    assert ckpt.best() == {"step": 2, "metric": "wer", "value": 0.2, "metrics": {"wer": 0.2}}
    ckpt.update_best(2, None)  # a checkpoint without metrics changes nothing
    ckpt.update_best(3, {"wer": 0.3})
    assert ckpt.best()["step"] == 2


def test_defaults_nested_directories_and_bad_keep(tmp_path):
    ckpt = Checkpoints(tmp_path / "run" / "checkpoints")  # created, parents too, by the first save
    assert ckpt.steps() == [] and ckpt.best() is None
    assert [ckpt.save(step, make_state(step), {}) for step in range(1, 6)][-1] == ckpt.path(5)
    assert ckpt.steps() == [3, 4, 5]  # keep defaults to 3, as checkpoint.keep does
    with pytest.raises(ValueError, match="keep must be at least 1; got 0"):
        Checkpoints(tmp_path, keep=0)


def test_a_file_damaged_on_its_way_to_disk_is_caught_by_the_read_back_and_prunes_nothing(tmp_path, monkeypatch):
    from jaxring.engine import checkpoint as checkpoint_lib

    ckpt = Checkpoints(tmp_path, keep=1)
    ckpt.save(1, make_state(1), {"at": 1})
    write = checkpoint_lib._atomic_write
    monkeypatch.setattr(checkpoint_lib, "_atomic_write", lambda path, data: write(path, data[:-9]))  # a disk that lies
    with pytest.raises(CheckpointError, match=f"checkpoint {ckpt.path(2)} is damaged"):
        ckpt.save(2, make_state(2), {"at": 2})
    monkeypatch.undo()
    assert ckpt.read(1).extra == {"at": 1}  # keep=1 notwithstanding, the intact one was not pruned


def test_a_save_is_fsynced_before_its_rename_and_the_directory_after(tmp_path, monkeypatch):
    import os

    calls = []
    descriptors = {}
    real = {name: getattr(os, name) for name in ("fsync", "replace", "open", "close")}

    def opened(path, *args):
        fd = real["open"](path, *args)
        descriptors[fd] = os.fspath(path)
        return fd

    def fsync(fd):  # a file's size when it is fsynced: all of its bytes, flushed from Python's buffer
        calls.append(("fsync", descriptors.get(fd) or os.fstat(fd).st_size))
        real["fsync"](fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append(("replace", os.path.basename(b))) or real["replace"](a, b))
    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "close", lambda fd: calls.append(("close", descriptors.get(fd, "file"))) or real["close"](fd))
    path = Checkpoints(tmp_path).save(1, make_state(1), {})
    monkeypatch.undo()
    directory = os.fspath(tmp_path)
    # the file's bytes reach the disk before it takes its name; the directory entry after; the directory is closed
    assert calls[:4] == [("fsync", path.stat().st_size), ("replace", "step_000000001.msgpack"), ("fsync", directory),
                         ("close", directory)], calls


def test_another_format_and_an_unreadable_payload_are_damaged(tmp_path):
    ckpt = Checkpoints(tmp_path)
    write_raw_checkpoint(ckpt.path(1), {"w": np.ones(3)}, {}, format=1)
    with pytest.raises(CheckpointError, match=f"checkpoint {ckpt.path(1)} is not a verified checkpoint of format 2"):
        ckpt.read(1)
    garbage = b"\xc1 not msgpack"
    wrapped = {"format": 2, "sha256": hashlib.sha256(garbage).hexdigest(), "payload": garbage}
    ckpt.path(2).write_bytes(flax.serialization.msgpack_serialize(wrapped))  # its digest matches: the payload is bad
    with pytest.raises(CheckpointError, match=f"checkpoint {ckpt.path(2)} holds an unreadable payload"):
        ckpt.read(2)
