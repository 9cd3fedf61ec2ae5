"""scripts/train.py, evaluate.py and transcribe.py end to end on a tiny corpus and model; train.py under mpirun."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import yaml

from tests.docs.markdown import command
from tests.tiny_runs import CONFIG, ROOT, finish, mpirun, tiny_overrides

sys.path.insert(0, str(ROOT / "scripts"))

import build_lm  # noqa: E402
import evaluate  # noqa: E402
import fit_lm_weights  # noqa: E402
import train  # noqa: E402
import transcribe  # noqa: E402

from jaxring.engine import cli, launch  # noqa: E402
from jaxring.engine.experiment import load_config  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny training run shared by the tests below."""
    tmp = tmp_path_factory.mktemp("run")
    workdir = tmp / "run"
    argv = ["--config", str(CONFIG), "--workdir", str(workdir), "--allreduce", "psum"]
    argv += tiny_overrides(tmp / "cache")
    summary = train.main(argv)
    return workdir, summary, tmp / "cache"


def test_train_writes_the_run_directory(run, capsys):
    workdir, summary, _ = run
    assert summary["steps"] == 3 and {"dev_cer", "dev_wer", "test_cer", "test_wer"} <= summary.keys()
    assert json.loads((workdir / "summary.json").read_text())["test_cer"] == summary["test_cer"]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and "dev_cer" in rows[1] and "dev_wer" in rows[2]
    assert (workdir / "config.yaml").read_text().count("rnn_hidden: 8") == 1
    assert "allreduce: psum" in (workdir / "config.yaml").read_text()
    assert {p.name for p in (workdir / "plots").iterdir()} == {"loss.png", "dev_metrics.png"}
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir())[-1] == "step_000000003.msgpack"
    # ds2_tiny's decode section: the test split also by beam search with a word LM of the training split
    assert summary["lm"] == str(workdir / "lm.arpa") and summary["beam_width"] == 16
    assert 0 <= summary["test_beam_cer"] and 0 <= summary["test_beam_wer"]
    assert summary["test_beam_step"] == summary["test_step"] == summary["best_step"]  # scored on the best weights


def test_corpus_synthesis_prints_timestamped_lines_once(tmp_path, capsys):
    from models.deepspeech2.data import ensure_synthetic_corpus

    launch.show_task_progress("models.deepspeech2.task")
    launch.show_task_progress("models.deepspeech2.task")  # run() twice in one process: one line per message
    ensure_synthetic_corpus(str(tmp_path), utterances=3, seed=5)
    ensure_synthetic_corpus(str(tmp_path), utterances=3, seed=5)  # already there: silent
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d synthesising 3 utterances into .*n3-seed5 \(once per corpus\)", lines[0])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d synthesised 3 utterances in \d+ s", lines[1])


def test_evaluate_with_beam_search_and_the_runs_lm_matches_the_summary(run):
    workdir, summary, _ = run
    flags = ["--beam-width", "16", "--lm", str(workdir / "lm.arpa"), "--alpha", str(summary["alpha"]),
             "--beta", str(summary["beta"])]
    result = evaluate.main(["--workdir", str(workdir), *flags])
    assert result["decoder"] == "beam" and result["cer"] == pytest.approx(summary["test_beam_cer"])
    assert result["wer"] == pytest.approx(summary["test_beam_wer"])
    # alpha and beta default to the run's decode section
    assert evaluate.main(["--workdir", str(workdir), *flags[:4]])["cer"] == pytest.approx(result["cer"])


def test_build_lm_from_a_run_rebuilds_the_runs_lm(run, tmp_path):
    workdir, _, _ = run
    sizes = build_lm.main(["--workdir", str(workdir), "--out", str(tmp_path / "w3.arpa")])
    assert sorted(sizes) == [1, 2, 3] and min(sizes.values()) > 0
    assert (tmp_path / "w3.arpa").read_text() == (workdir / "lm.arpa").read_text()


def test_fit_lm_weights_picks_the_best_of_its_grid(run, tmp_path):
    workdir, _, _ = run
    result = fit_lm_weights.main(["--workdir", str(workdir), "--lm", str(workdir / "lm.arpa"), "--alphas", "0.2,1.5",
                                  "--betas", "0,2", "--beam-width", "4", "--json", str(tmp_path / "fit.json")])
    assert len(result["grid"]) == 4 and result["best"] == min(result["grid"], key=lambda r: (r["wer"], r["cer"]))
    assert json.loads((tmp_path / "fit.json").read_text())["best"] == result["best"]
    greedy = evaluate.main(["--workdir", str(workdir), "--split", "dev"])
    assert result["greedy"]["cer"] == pytest.approx(greedy["cer"])  # all 3 dev utterances, same checkpoint


def test_config_paths_mean_the_same_files_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(ROOT / "configs" / "ds2_tiny.yaml", ["data.manifest_dir=lists"], paths_relative_to=ROOT)
    assert config.data.cache_dir == str(ROOT / "data" / "cache")  # the file says data/cache
    assert config.data.manifest_dir == str(tmp_path / "lists")  # --set: from the cwd


def test_an_installed_jaxring_reads_config_paths_from_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(ROOT / "configs" / "ds2_tiny.yaml")  # what jaxring-train does: no checkout to name
    assert config.data.cache_dir == str(tmp_path / "data" / "cache")


def test_the_default_run_directory_is_runs_slash_the_config_name_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    workdir = cli.parse_train_args(["--config", str(ROOT / "configs" / "ds2_tiny.yaml")]).workdir
    assert workdir.resolve() == tmp_path / "runs" / "ds2_tiny"  # where the user is, not inside the checkout


def test_evaluate_from_another_directory_reads_the_runs_corpus(run, tmp_path):
    workdir, summary, cache = run
    saved = yaml.safe_load((workdir / "config.yaml").read_text())
    assert saved["data"]["cache_dir"] == str(cache)  # the run directory stores absolute paths
    # A run directory written before paths were saved absolute: data/cache-style, relative to the checkout.
    old = tmp_path / "old_run"
    shutil.copytree(workdir / "checkpoints", old / "checkpoints")
    saved["data"]["cache_dir"] = os.path.relpath(cache, ROOT)
    (old / "config.yaml").write_text(yaml.safe_dump(saved))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    finished = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), "--workdir", str(old)],
                              cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    assert result["cer"] == pytest.approx(summary["test_cer"]) and Path(result["manifest"]).is_relative_to(cache)
    assert list(elsewhere.iterdir()) == []  # no corpus synthesised into the cwd


def test_evaluate_says_when_it_synthesises_a_missing_corpus_and_scores_the_same(run, tmp_path, capsys):
    """A run directory from another checkout or machine: its corpus is not where config.yaml says."""
    workdir, summary, _ = run
    moved = tmp_path / "moved_run"
    shutil.copytree(workdir / "checkpoints", moved / "checkpoints")
    saved = yaml.safe_load((workdir / "config.yaml").read_text())
    saved["data"]["cache_dir"] = str(tmp_path / "no_corpus_here")
    (moved / "config.yaml").write_text(yaml.safe_dump(saved))
    result = evaluate.main(["--workdir", str(moved)])
    err = capsys.readouterr().err
    assert f"the run's corpus is not in {tmp_path / 'no_corpus_here'}" in err and "synthesising all 30 utterances" in err
    assert result["cer"] == pytest.approx(summary["test_cer"])  # the corpus is synthesised the same again
    evaluate.main(["--workdir", str(moved)])
    assert "synthesising" not in capsys.readouterr().err  # there now: nothing to say


def test_a_relative_lm_that_is_not_there_names_the_runs_own(run, tmp_path, monkeypatch):
    workdir = run[0]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=f"--lm runs/tiny/lm.arpa does not exist \\(a relative path is relative to "
                       f"the current directory, {tmp_path}\\); the run has its own LM: --lm {workdir / 'lm.arpa'}"):
        evaluate.main(["--workdir", str(workdir), "--beam-width", "4", "--lm", "runs/tiny/lm.arpa"])
    monkeypatch.chdir(workdir.parent)
    result = evaluate.main(["--workdir", workdir.name, "--beam-width", "4", "--lm", f"{workdir.name}/lm.arpa"])
    assert result["lm"] == str(workdir / "lm.arpa")  # absolute, as every path the results name


def test_evaluate_prints_the_scores_of_the_best_checkpoint(run, capsys):
    workdir, summary, _ = run
    result = evaluate.main(["--workdir", str(workdir)])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == result
    assert result["step"] == summary["best_step"]
    assert result["cer"] == pytest.approx(summary["test_cer"]) and result["wer"] == pytest.approx(summary["test_wer"])
    dev = evaluate.main(["--workdir", str(workdir), "--manifest", str(Path(result["manifest"]).with_name("dev.jsonl")),
                         "--checkpoint", "latest"])
    assert dev["step"] == 3 and dev["cer"] == pytest.approx(summary["dev_cer"])


def test_evaluate_by_a_manifest_field_scores_each_value_alone(run, tmp_path):
    workdir, summary, _ = run
    whole = evaluate.main(["--workdir", str(workdir), "--split", "dev"])
    rows = [json.loads(line) for line in Path(whole["manifest"]).read_text().splitlines()]
    # one value for all: the same score as the whole split
    everyone = tmp_path / "dev.jsonl"
    everyone.write_text("".join(json.dumps({**r, "audio_filepath": str(Path(whole["manifest"]).parent / r["audio_filepath"]),
                                            "team": "all"}) + "\n" for r in rows))
    one = evaluate.main(["--workdir", str(workdir), "--manifest", str(everyone), "--by", "team"])["groups"]
    assert list(one) == ["all"] and one["all"] == {k: whole[k] for k in ("cer", "wer", "utterances")}
    # each voice alone: as many groups as voices, each scored on the utterances it speaks (at most --per-group)
    by_voice = evaluate.main(["--workdir", str(workdir), "--split", "dev", "--by", "voice", "--per-group", "1"])
    assert list(by_voice["groups"]) == sorted({r["voice"] for r in rows})
    assert {g["utterances"] for g in by_voice["groups"].values()} == {1}
    for voice, got in by_voice["groups"].items():
        first = next(r for r in rows if r["voice"] == voice)
        alone = tmp_path / "alone.jsonl"
        alone.write_text(json.dumps({**first, "audio_filepath": str(Path(whole["manifest"]).parent / first["audio_filepath"])}))
        assert got == {k: v for k, v in evaluate.main(["--workdir", str(workdir), "--manifest", str(alone)]).items()
                       if k in ("cer", "wer", "utterances")}
    with pytest.raises(SystemExit, match="no JSON object with a field 'speaker' for --by"):
        evaluate.main(["--workdir", str(workdir), "--split", "dev", "--by", "speaker"])


def test_transcribe_prints_one_line_per_file(run, capsys):
    workdir, _, cache = run
    corpus = next(path for path in cache.glob("espeak-*") if path.is_dir())
    audio = sorted((corpus / "audio" / "test").glob("*.flac"))[:2]
    texts = transcribe.main(["--workdir", str(workdir), *map(str, audio)])
    assert capsys.readouterr().out.splitlines()[-2:] == [f"{a}\t{t}" for a, t in zip(audio, texts)]
    beam = transcribe.main(["--workdir", str(workdir), "--beam-width", "8", "--lm", str(workdir / "lm.arpa"),
                            *map(str, audio)])
    assert capsys.readouterr().out.splitlines()[-2:] == [f"{a}\t{t}" for a, t in zip(audio, beam)]


def test_transcribe_names_each_bad_file_and_transcribes_the_others(run, tmp_path, capsys):
    workdir, _, cache = run
    corpus = next(path for path in cache.glob("espeak-*") if path.is_dir())
    good = sorted((corpus / "audio" / "test").glob("*.flac"))[:2]
    nan_wav, garbage, missing = tmp_path / "nan.wav", tmp_path / "garbage.flac", tmp_path / "missing.wav"
    samples = np.random.default_rng(0).uniform(-0.5, 0.5, 16000).astype(np.float32)
    samples[1234] = np.nan
    soundfile.write(str(nan_wav), samples, 16000, subtype="FLOAT")
    garbage.write_bytes(np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    expected = transcribe.main(["--workdir", str(workdir), *map(str, good)])
    capsys.readouterr()
    paths = [good[0], nan_wav, garbage, missing, good[1]]
    with pytest.raises(SystemExit) as exit_status:
        transcribe.main(["--workdir", str(workdir), *map(str, paths)])
    assert exit_status.value.code == 1
    out, err = capsys.readouterr()
    lines = [line.split("\t") for line in out.splitlines()]
    assert [path for path, _ in lines] == list(map(str, paths))  # one line per file, in order
    assert [text for _, text in lines[::4]] == expected
    assert lines[1][1] == "error: non-finite audio samples" and lines[3][1] == "error: missing file"
    assert lines[2][1].startswith("error: unreadable audio (")
    assert err.splitlines() == [
        f"error: {nan_wav}: non-finite audio samples",
        *[line for line in err.splitlines() if line.startswith(f"error: {garbage}: unreadable audio (")],
        f"error: {missing}: missing file",
    ]


def test_clear_errors(run, tmp_path, capsys):
    with pytest.raises(SystemExit, match="unknown key 'lerning_rate' in optim; did you mean 'learning_rate'"):
        train.main(["--config", str(CONFIG), "--set", "optim.lerning_rate=1"])
    with pytest.raises(SystemExit, match="config.yaml does not exist"):
        evaluate.main(["--workdir", str(tmp_path)])
    with pytest.raises(SystemExit, match="config.yaml does not exist"):
        transcribe.main(["--workdir", str(tmp_path), "nope.wav"])
    with pytest.raises(SystemExit, match="weight a beam search; add --beam-width"):
        evaluate.main(["--workdir", str(run[0]), "--lm", "x.arpa"])
    with pytest.raises(SystemExit, match="--lm nope.arpa does not exist"):
        evaluate.main(["--workdir", str(run[0]), "--beam-width", "4", "--lm", "nope.arpa"])
    with pytest.raises(SystemExit):
        train.main(["--resume"])
    assert "give --config, or --workdir with --resume" in capsys.readouterr().err


def test_train_under_mpirun(run, tmp_path):
    """docs/TRAINING.md's mpirun line as written, with the flags its comment names for root (and
    --oversubscribe: fewer cores than processes here), on a tiny model."""
    _, _, cache = run  # the corpus is already there
    words = command("docs/TRAINING.md", "mpirun -np 2 python -m mpi4py scripts/train.py ")
    assert words[:6] == ["mpirun", "-np", "2", "python", "-m", "mpi4py"]  # what mpirun(2, ..., with_mpi4py) runs
    args = [str(ROOT / w) if w.startswith("configs/") else str(tmp_path / "mpi") if w == "runs/mpi" else w
            for w in words[7:]]
    assert args == ["--config", str(CONFIG), "--workdir", str(tmp_path / "mpi")]
    args += tiny_overrides(cache) + ["--set", "eval.every_steps=0", "--set", "checkpoint.every_steps=0"]
    args += ["--set", "train.bucket_bytes=4096"]  # several fused buckets cross the processes
    code, output = finish(mpirun(2, [ROOT / words[6], *args], with_mpi4py=True), timeout_s=170)
    assert code is not None, f"mpirun did not finish within 170 s:\n{output}"
    assert code == 0, output
    # Open MPI gives ranks a terminal even through this pipe: lines, not a bar, all the same.
    assert re.findall(r"\d\d:\d\d:\d\d step (\d)/3 loss", output) == ["1", "2", "3"] and "\r" not in output
    assert "2 local cpu devices x 2 processes, global batch 8 (2 per device)" in output
    assert output.count("test CER") == 1  # printed by rank 0 only
    assert "(greedy), CER" in output and "(beam 16 + LM) on the synthetic eSpeak test split" in output
    assert "; trained on 2 cpu devices x 2 processes, ring all-reduce " in output  # the last line says what trained it
    summary = json.loads((tmp_path / "mpi" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 3 and summary["test_cer"] >= 0
    assert summary["test_utterances"] == 3  # the two ranks' shares add up to the whole test split
