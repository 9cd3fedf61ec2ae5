"""Taking over a run directory: nothing is deleted without --overwrite, and then only after a new checkpoint."""

import pytest

from jaxring.engine import rundir


def old_run(workdir):
    """A run directory as train.py leaves it, with distinct bytes in every file."""
    (workdir / "checkpoints").mkdir(parents=True)
    for step in (2, 4):
        (workdir / "checkpoints" / f"step_{step:09d}.msgpack").write_bytes(bytes([step]) * 10)
    for name in ("metrics.jsonl", "summary.json", "config.yaml"):
        (workdir / name).write_text(f"old {name}")
    return files(workdir)


def files(workdir):
    return {p.relative_to(workdir).as_posix(): p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}


def test_a_run_is_refused_without_flags_and_nothing_moves(tmp_path):
    before = old_run(tmp_path)
    with pytest.raises(rundir.RunDirectoryError, match=f"{tmp_path} holds checkpoints up to step 4: give --resume"):
        rundir.take_over(tmp_path, [2, 4], resume=False, overwrite=False, lead=True)
    assert files(tmp_path) == before


def test_resume_continues_and_an_empty_directory_starts_fresh_with_a_notice(tmp_path, capsys):
    before = old_run(tmp_path)
    assert rundir.take_over(tmp_path, [2, 4], resume=True, overwrite=False, lead=True) is True
    assert files(tmp_path) == before
    empty = tmp_path / "empty"
    assert rundir.take_over(empty, [], resume=True, overwrite=False, lead=True) is False
    assert capsys.readouterr().out == f"--resume: no checkpoint in {empty}, starting a fresh run there\n"


def test_overwrite_keeps_the_old_run_until_the_first_new_checkpoint(tmp_path):
    before = old_run(tmp_path)
    assert rundir.take_over(tmp_path, [2, 4], resume=False, overwrite=True, lead=True) is False
    assert files(tmp_path) == {f"replaced/{name}": data for name, data in before.items()}
    # Stopped before its first checkpoint, the new run left a metrics file; a plain rerun is refused,
    # a second --overwrite still keeps the replaced run.
    (tmp_path / "metrics.jsonl").write_text("new")
    with pytest.raises(rundir.RunDirectoryError, match="holds a replaced run"):
        rundir.take_over(tmp_path, [], resume=False, overwrite=False, lead=True)
    rundir.take_over(tmp_path, [], resume=False, overwrite=True, lead=True)
    assert files(tmp_path) == {f"replaced/{name}": data for name, data in before.items()}
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_000000001.msgpack").write_bytes(b"new")
    rundir.discard_replaced(tmp_path)
    assert files(tmp_path) == {"checkpoints/step_000000001.msgpack": b"new"}


def test_only_the_lead_process_moves_files_and_both_flags_are_an_error(tmp_path):
    before = old_run(tmp_path)
    assert rundir.take_over(tmp_path, [2, 4], resume=False, overwrite=True, lead=False) is False
    assert files(tmp_path) == before
    with pytest.raises(rundir.RunDirectoryError, match="--resume or --overwrite, not both"):
        rundir.take_over(tmp_path, [2, 4], resume=True, overwrite=True, lead=True)


def test_overwrite_after_a_run_that_checkpointed_but_kept_replaced_sets_aside_that_newer_run(tmp_path):
    old_run(tmp_path)
    rundir.take_over(tmp_path, [2, 4], resume=False, overwrite=True, lead=True)
    # The --overwrite run wrote a checkpoint, then was killed before deleting replaced/.
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_000000003.msgpack").write_bytes(b"newer run")
    (tmp_path / "metrics.jsonl").write_text("newer metrics")
    newer = {name: data for name, data in files(tmp_path).items() if not name.startswith("replaced/")}
    rundir.take_over(tmp_path, [3], resume=False, overwrite=True, lead=True)
    # the run being replaced now is the newer one; the older one, already replaced once, is gone
    assert files(tmp_path) == {f"replaced/{name}": data for name, data in newer.items()}


def test_a_fresh_directory_starts_fresh_and_overwrite_creates_nothing_there(tmp_path, capsys):
    assert rundir.take_over(tmp_path, [], resume=False, overwrite=False, lead=True) is False
    assert rundir.take_over(tmp_path, [], resume=False, overwrite=True, lead=True) is False
    assert not any(tmp_path.iterdir()) and capsys.readouterr().out == ""


def test_overwrite_says_where_the_old_run_is(tmp_path, capsys):
    old_run(tmp_path)
    rundir.take_over(tmp_path, [2, 4], resume=False, overwrite=True, lead=True)
    assert capsys.readouterr().out == (
        f"--overwrite: the previous run moved to {tmp_path / 'replaced'}; it is deleted once the first new checkpoint exists\n")
    rundir.take_over(tmp_path, [], resume=False, overwrite=True, lead=True)  # again, before a new checkpoint
    assert capsys.readouterr().out == (
        f"--overwrite: the run set aside earlier stays in {tmp_path / 'replaced'} until the first new checkpoint\n")
