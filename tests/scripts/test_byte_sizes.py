"""Size arguments of the benchmark scripts: one parser (scripts/bench/byte_sizes.py), K/M/G suffixes everywhere."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import bench_allreduce_mpi  # noqa: E402
from byte_sizes import parse_bytes  # noqa: E402


@pytest.mark.parametrize(
    "text, size",
    [
        ("4096", 4096),
        ("1K", 1024),
        ("1k", 1024),
        ("64M", 64 * 1024 * 1024),
        ("64MiB", 64 * 1024 * 1024),
        ("64MB", 64 * 1024 * 1024),
        ("2G", 2 * 1024**3),
        ("1.5K", 1536),
        (" 3 K ", 3072),
        ("0", 0),
    ],
)
def test_sizes_with_and_without_suffixes(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize(
    "text, message",
    [
        ("64Q", "'64Q' is not a size; write bytes as e.g. 4096, 1K, 64M or 1.5G"),
        ("", "is not a size"),
        ("-1K", "is not a size"),
        ("M", "is not a size"),
        ("0.3K", r"'0.3K' is not a whole number of bytes \(307.2\)"),
    ],
)
def test_bad_sizes_say_what_is_accepted(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_bytes(text)


def test_bench_allreduce_mpi_takes_suffixes_and_plain_bytes():
    assert bench_allreduce_mpi.parse_args(["--max-bytes", "64M"]).max_bytes == 64 << 20
    assert bench_allreduce_mpi.parse_args(["--max-bytes", "65536"]).max_bytes == 65536


def test_bench_allreduce_runs_with_suffixed_sizes(tmp_path):
    records = tmp_path / "records.json"
    command = [sys.executable, str(ROOT / "scripts" / "bench" / "bench_allreduce.py"), "--devices", "2", "--min-bytes", "1K",
               "--max-bytes", "4K", "--dtypes", "float32", "--repeats", "1", "--json", str(records)]
    environment = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert sorted({r["bytes"] for r in json.loads(records.read_text())["records"]}) == [1024, 4096]
    rejected = subprocess.run(command[:2] + ["--min-bytes", "1X"], capture_output=True, text=True, timeout=60)
    assert rejected.returncode == 2 and "'1X' is not a size" in rejected.stderr
