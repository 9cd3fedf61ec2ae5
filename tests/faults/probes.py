"""Bad inputs and faults tried on the real scripts as a user would; prints a table of outcomes and writes JSON.

    .venv/bin/python tests/faults/probes.py --json runs/fault_probes.json

Each probe runs train.py, evaluate.py or transcribe.py (under mpirun for the
multi-process ones) in a scratch folder and is classified:

  clear error   non-zero exit, no traceback, and the message names what was wrong
  correct       the documented behaviour (a fallback, a report, a resume)
  cryptic       failed, but with a traceback or without naming the bad input
  silent        exit 0 where an error or a report was due
  hang          still running at its time limit (then killed)
  loss          files of a run deleted, or a checkpoint holding a NaN

Not a test (pytest does not collect it): it takes minutes; tests/faults/test_*.py
run the essential ones within the suite's budget.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from jaxring.engine.checkpoint import Checkpoints  # noqa: E402
from models.deepspeech2.data import ensure_synthetic_corpus  # noqa: E402
from tests.tiny_runs import CONFIG, TRAIN, finish, mpirun, rank_pid, tiny_overrides  # noqa: E402

SCRIPTS = ROOT / "scripts"
LIMIT_S = 240
MPI_TIMEOUT_S = 3


class Probe:
    """What one command did: exit code (None: hung), output, and the outcome it is classified as."""

    def __init__(self, name):
        self.name, self.outcome, self.detail = name, None, ""

    def run(self, command, timeout=LIMIT_S, env=None):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True, env={**os.environ, **(env or {})})
        self.code, self.output = finish(process, timeout)
        return self

    def expect_error(self, *needles):
        """Classifies as an expected error whose message contains every needle."""
        lines = self.output.strip().splitlines()
        last = lines[-1] if lines else ""
        if self.code is None:
            self.outcome = "hang"
        elif self.code == 0:
            self.outcome = "silent"
        elif "Traceback" in self.output or not all(n in self.output for n in needles):
            self.outcome = "cryptic"
        else:
            self.outcome = "clear error"
        self.detail = last[:160]
        return self

    def expect(self, ok: bool, detail: str, failure: str = "silent"):
        self.outcome = "hang" if self.code is None else ("correct" if ok else failure)
        self.detail = detail if ok else f"{detail}: {self.output.strip().splitlines()[-1:]}"
        return self


def train(workdir, cache, *extra, **values):
    return [sys.executable, str(TRAIN), "--config", str(CONFIG), "--workdir", str(workdir),
            *tiny_overrides(cache, **values), *extra]


def config_file(folder, name, text):
    path = folder / name
    path.write_text(text)
    return [sys.executable, str(TRAIN), "--config", str(path), "--workdir", str(folder / "never")]


def manifests(cache, folder, train_lines=None, dev_lines=None):
    """--set arguments for manifests copied from the synthetic corpus, with lines replaced where given."""
    corpus = next(p for p in cache.glob("espeak-*") if p.is_dir())
    folder.mkdir(parents=True, exist_ok=True)
    values = {"data.corpus": "manifest"}
    for split, lines in (("train", train_lines), ("dev", dev_lines), ("test", None)):
        entries = [json.loads(line) for line in (corpus / f"{split}.jsonl").read_text().splitlines()]
        for entry in entries:
            entry["audio_filepath"] = str(corpus / entry["audio_filepath"])
        text = "".join(json.dumps(e) + "\n" for e in entries)
        path = folder / f"{split}.jsonl"
        if callable(lines):
            lines(path, entries)
        else:
            path.write_text(text)
        values[f"data.{split}_manifest"] = str(path)
    return values


def nan_wav(path, seconds=1.5):
    samples = np.random.default_rng(0).uniform(-0.3, 0.3, int(16000 * seconds)).astype(np.float32)
    samples[len(samples) // 2] = np.nan
    soundfile.write(str(path), samples, 16000, subtype="FLOAT")
    return path


def all_finite(workdir) -> bool:
    checkpoints = Checkpoints(Path(workdir) / "checkpoints")
    for step in checkpoints.steps():
        state = checkpoints.read(step).state
        for leaf in _leaves(state):
            leaf = np.asarray(leaf)
            if np.issubdtype(leaf.dtype, np.inexact) and not np.isfinite(leaf).all():
                return False
    return True


def _leaves(tree):
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    return [tree]


def snapshot(workdir):
    return {p.relative_to(workdir): p.read_bytes() for p in sorted(Path(workdir).rglob("*")) if p.is_file()}


def probes(tmp: Path, cache: Path):  # noqa: C901 (one probe after another)
    bad_cfg = tmp / "configs"
    bad_cfg.mkdir()
    head = "task: deepspeech2\n"
    for name, text, needles in [
        ("YAML syntax error", head + "train:\n  epochs: 3\n   seed: 1\n", ["syntax.yaml:4:", "YAML syntax error"]),
        ("empty YAML", "", ["empty file"]),
        ("YAML without sections", head, ["at least one section"]),
        ("YAML scalar", "42\n", ["a config is a YAML mapping"]),
        ("rnn_hidden: 12.5", head + "model:\n  rnn_hidden: 12.5\n", ["model.rnn_hidden must be int"]),
        ("binary config", None, ["not a YAML file"]),
    ]:
        path_name = "syntax.yaml" if name == "YAML syntax error" else name.replace(" ", "_") + ".yaml"
        command = config_file(bad_cfg, path_name, text if text is not None else "")
        if text is None:
            (bad_cfg / path_name).write_bytes(b"\xff\xfe\x00\x81" * 50)
        yield Probe(f"config: {name}").run(command).expect_error(*needles)
    for override, needle in [
        ("train.epochs=0", "train.epochs must be positive"), ("train.max_steps=0", "train.max_steps must be positive"),
        ("train.max_steps=-3", "train.max_steps must be positive"), ("train.epochs=1.5", "expected int"),
        ("eval.batch_size=0", "eval.batch_size must be positive"),
        ("eval.every_steps=-2", "eval.every_steps must be 0"), ("checkpoint.every_steps=-1", "checkpoint.every_steps"),
        ("checkpoint.keep=0", "checkpoint.keep must be positive"), ("optim.learning_rate=nan", "learning_rate"),
        ("optim.lerning_rate=1", "did you mean 'learning_rate'"), ("data.max_unusable_share=2", "max_unusable_share"),
    ]:
        yield Probe(f"--set {override}").run(train(tmp / "never", cache, "--set", override)).expect_error(needle)

    # Manifests: each checked before the first step.
    def replace_lines(bad_lines, keep=0):
        def write(path, entries):
            kept = entries[:keep] if keep else []
            path.write_text("".join(json.dumps(e) + "\n" for e in kept) + "".join(line + "\n" for line in bad_lines))
        return write

    def binary(path, entries):
        path.write_bytes(bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8)))

    for name, split, writer, needle in [
        ("train manifest missing", "train", lambda p, e: None, "cannot be read"),
        ("binary dev manifest", "dev", binary, "utterances are unusable"),
        ("dev manifest, every line bad", "dev", replace_lines(["{", "[]", '{"duration": 1}']), "3 of 3 utterances"),
        ("train durations 1e6 and NaN (2 of 4 lines)", "train",
         replace_lines(['{"audio_filepath": "a.flac", "duration": 1e6, "text": "a"}',
                        '{"audio_filepath": "a.flac", "duration": NaN, "text": "b"}'], keep=2), "bad manifest line"),
    ]:
        folder = tmp / name.replace(" ", "_").replace(",", "")
        values = manifests(cache, folder, **{f"{split}_lines": writer})
        workdir = folder / "run"
        probe = Probe(f"manifest: {name}").run(train(workdir, cache, **values)).expect_error(needle)
        if probe.outcome == "clear error" and (workdir / "checkpoints").exists():
            probe.outcome, probe.detail = "cryptic", "failed only after training had started"
        yield probe
    undecodable = tmp / "undecodable"
    undecodable.mkdir()

    def garbage_audio(path, entries):
        for i, entry in enumerate(entries):
            entry["audio_filepath"] = str(undecodable / f"{i}.flac")
            Path(entry["audio_filepath"]).write_bytes(os.urandom(3000))
        path.write_text("".join(json.dumps(e) + "\n" for e in entries))

    values = manifests(cache, tmp / "all_undecodable", train_lines=garbage_audio)
    yield Probe("manifest: every train file undecodable").run(train(tmp / "all_undecodable" / "run", cache, **values)
                                                                ).expect_error("unreadable audio")

    # Run directories and checkpoints.
    run = tmp / "run"
    probe = Probe("--resume on an empty workdir").run(train(run, cache, "--resume"))
    yield probe.expect(probe.code == 0 and "no checkpoint in" in probe.output and "starting a fresh run" in probe.output,
                       "starts fresh with a notice")
    before = snapshot(run)
    probe = Probe("rerun a finished workdir without flags").run(train(run, cache))
    probe.expect_error("--resume", "--overwrite")
    if snapshot(run) != before:
        probe.outcome, probe.detail = "loss", "files changed"
    yield probe
    copy = tmp / "overwritten"
    shutil.copytree(run, copy)
    before = snapshot(copy)
    job = subprocess.Popen(train(copy, cache, "--overwrite"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while job.poll() is None and not (copy / "replaced").exists():
        time.sleep(0.01)
    job.send_signal(signal.SIGKILL)
    job.wait()
    # Killed at once: some files may not have moved yet. Lost is what is neither in place nor in replaced/.
    after = {Path(*p.parts[1:]) if p.parts[0] == "replaced" else p: data for p, data in snapshot(copy).items()}
    old_checkpoints = {p: data for p, data in before.items() if p.parts[0] == "checkpoints"}
    probe = Probe("--overwrite killed before its first checkpoint")
    probe.code, probe.output = -9, ""
    yield probe.expect(all(after.get(p) == data for p, data in old_checkpoints.items()),
                       "every old checkpoint intact", failure="loss")

    evaluate = [sys.executable, str(SCRIPTS / "evaluate.py"), "--workdir"]
    for name, damage, checkpoint in [("truncated", "truncate", "latest"), ("bit-flipped", "flip", "latest"),
                                     ("best one truncated", "truncate", "best")]:
        damaged = tmp / f"damaged_{damage}_{checkpoint}"
        shutil.copytree(run, damaged)
        checkpoints = Checkpoints(damaged / "checkpoints")
        step = checkpoints.best()["step"] if checkpoint == "best" else checkpoints.steps()[-1]
        path = checkpoints.path(step)
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[: len(data) // 3]
        else:
            data[len(data) // 2] ^= 0x04
        path.write_bytes(bytes(data))
        probe = Probe(f"checkpoint {name}: evaluate.py --checkpoint {checkpoint}").run(
            evaluate + [str(damaged), "--checkpoint", checkpoint])
        yield probe.expect(probe.code == 0 and f"checkpoint {path}" in probe.output, "named, fell back to an intact one")
        if damage == "flip":
            probe = Probe("checkpoint bit-flipped: train.py --resume").run(train(damaged, cache, "--resume"))
            yield probe.expect(probe.code == 0 and f"checkpoint {path}" in probe.output and all_finite(damaged),
                               "named, resumed from the previous one")
    every = tmp / "every_damaged"
    shutil.copytree(run, every)
    for path in (every / "checkpoints").glob("step_*"):
        path.write_bytes(path.read_bytes()[:50])
    yield Probe("every checkpoint truncated: evaluate.py").run(evaluate + [str(every)]).expect_error("no intact checkpoint")

    # Data faults during training.
    def with_nan_audio(path, entries):
        # Whole batches of 8 with it: no epoch leaves it out.
        entries = entries[:-1] + [{"audio_filepath": str(nan_wav(tmp / "nan.wav")), "duration": 1.5, "text": "nan"}]
        path.write_text("".join(json.dumps(e) + "\n" for e in entries))

    values = manifests(cache, tmp / "nan_audio", train_lines=with_nan_audio)
    probe = Probe("NaN audio in the train split").run(train(tmp / "nan_audio" / "run", cache, **values))
    report = tmp / "nan_audio" / "run" / "data_report.json"
    yield probe.expect(probe.code == 0 and "data: skipped" in probe.output and "non-finite audio samples" in probe.output
                       and report.exists()
                       and all_finite(tmp / "nan_audio" / "run"), "skipped, reported, no NaN saved")
    diverge = tmp / "diverge"
    probe = Probe("learning rate 1e30").run(train(diverge, cache, **{"optim.learning_rate": 1e30, "optim.clip_norm": None}))
    probe.expect_error("loss is", ".flac")
    if not all_finite(diverge):
        probe.outcome = "loss"
    yield probe

    # evaluate.py and transcribe.py on bad files.
    corpus = next(p for p in cache.glob("espeak-*") if p.is_dir())
    good = sorted((corpus / "audio" / "test").glob("*.flac"))[:2]
    garbage = tmp / "garbage.flac"
    garbage.write_bytes(os.urandom(2000))
    transcribe = [sys.executable, str(SCRIPTS / "transcribe.py"), "--workdir", str(run)]
    probe = Probe("transcribe.py: good, NaN, garbage, missing files").run(
        transcribe + [str(good[0]), str(tmp / "nan.wav"), str(garbage), str(tmp / "missing.wav"), str(good[1])])
    lines = probe.output.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    yield probe.expect(probe.code == 1 and len(errors) == 3 and len(lines) == 5, "one line each, exit 1")
    messy = tmp / "messy.jsonl"
    entries = [json.loads(line) for line in (corpus / "test.jsonl").read_text().splitlines()]
    lines = [json.dumps({**e, "audio_filepath": str(corpus / e["audio_filepath"])}) for e in entries]
    lines += ["{broken", json.dumps({"audio_filepath": str(garbage), "duration": 1.0, "text": "garbage"}),
              json.dumps({"audio_filepath": str(tmp / "nan.wav"), "duration": 1.5, "text": "nan"})]
    messy.write_text("\n".join(lines) + "\n")
    probe = Probe("evaluate.py: manifest with 3 bad entries").run(evaluate + [str(run), "--manifest", str(messy)])
    skipped = [line for line in probe.output.splitlines() if line.startswith("skipped ")]
    yield probe.expect(probe.code == 1 and len(skipped) == 3 and '"utterances": ' in probe.output,
                       "one line each, the others scored, exit 1")
    binary_manifest = tmp / "binary.jsonl"
    binary_manifest.write_bytes(os.urandom(3000))
    yield Probe("evaluate.py: binary manifest").run(evaluate + [str(run), "--manifest", str(binary_manifest)]
                                                    ).expect_error(str(binary_manifest))

    # Several processes.
    env = {"JAXRING_TIMEOUT_S": str(MPI_TIMEOUT_S)}
    worker = Path(__file__).with_name("stopping_worker.py")
    for with_mpi4py in (False, True):
        started = time.monotonic()
        probe = Probe(f"SIGSTOP mid-exchange, mpirun python{' -m mpi4py' if with_mpi4py else ''}")
        probe.code, probe.output = finish(mpirun(2, [worker], env=env, with_mpi4py=with_mpi4py), 120)
        # The worker has no handler: its TimeoutError's traceback, then the abort, is the designed end.
        yield probe.expect(probe.code not in (None, 0) and "no answer from rank 1" in probe.output,
                           f"ended after {time.monotonic() - started:.0f} s, naming rank 1")
    early = tmp / "early"
    job = mpirun(2, train(early, cache)[1:], env=env)
    while (pid := rank_pid(early, 1)) is None and job.poll() is None:
        time.sleep(0.01)
    if pid is not None:
        os.kill(pid, signal.SIGSTOP)  # while it imports, before MPI_Init
    started = time.monotonic()
    probe = Probe("SIGSTOP a rank of train.py before MPI_Init")
    probe.code, probe.output = finish(job, 150)
    yield probe.expect(probe.code not in (None, 0), f"ended after {time.monotonic() - started:.0f} s")
    seeds = tmp / "seeds"
    command = train(seeds, cache, "--set", "train.seed=0")
    job = mpirun(1, command[1:] + [":", "-np", "1", sys.executable] + train(seeds, cache, "--set", "train.seed=1")[1:],
                 env=env)
    probe = Probe("different train.seed per rank")
    probe.code, probe.output = finish(job, LIMIT_S)
    yield probe.expect_error("train.seed=0", "train.seed=1")


def report(rows: list[dict], json_path: Path | None, **settings) -> None:
    """Prints how many probes ended each way; writes `settings`, the rows and the counts to `json_path`."""
    counts = {}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    print(f"\n{len(rows)} probes: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({**settings, "probes": rows, "counts": counts}, indent=2) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory(prefix="jaxring_probes_") as scratch:
        tmp = Path(scratch)
        cache = tmp / "cache"
        ensure_synthetic_corpus(str(cache), 30, 0)
        rows = []
        for probe in probes(tmp, cache):
            rows.append({"probe": probe.name, "outcome": probe.outcome, "exit": probe.code, "detail": probe.detail})
            print(f"{probe.outcome:12} {probe.name:55} {probe.detail}", flush=True)
    report(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
