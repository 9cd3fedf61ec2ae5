"""The numbers README's "Is it faster?" table and PERFORMANCE.md's summaries give, and how each is computed
from the JSON it cites: tests/docs/test_doc_numbers.py finds each claim's text in its page and checks every
number in it against the computation, to the digits the page shows.

A claim: the page, a regular expression whose groups are the numbers (it must match the page once, its
whitespace folded), the JSON files, and a function from their records to the numbers, in group order."""

import dataclasses
import json
import statistics
from typing import Callable

from tests.docs.markdown import ROOT

BENCH = "docs/bench/"


def table_rows(doc: str, header: str) -> list[dict]:
    """The rows of the Markdown table of `doc` whose header line starts `| header`, as header -> cell."""
    lines = (ROOT / doc).read_text().splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith(f"| {header}")]
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))))
    return rows


def records(source: str) -> list[dict] | dict:
    """The records of `source`: a JSON file's "records" (or the file, a list), "PATH:KEY"'s value at KEY, or
    for a page's table without a JSON behind it, "DOC#FIRST HEADER"'s rows."""
    if "#" in source:
        return table_rows(*source.split("#"))
    path, _, key = source.partition(":")
    data = json.loads((ROOT / path).read_text())
    return data[key or "records"] if isinstance(data, dict) else data


@dataclasses.dataclass(frozen=True)
class Claim:
    doc: str
    pattern: str
    sources: tuple[str, ...]
    compute: Callable[..., tuple[float, ...]]  # the sources' records, in order -> the numbers

    def values(self) -> tuple[float, ...]:
        return tuple(self.compute(*(records(source) for source in self.sources)))


def devices_per_process(run):
    (per_process,) = {r["n_devices"] // r["n_procs"] for r in run}
    return per_process


def span(values) -> tuple[float, float]:
    values = list(values)
    return min(values), max(values)


# -- all-reduce on 8 host devices against psum (PERFORMANCE.md, "All-reduce on host devices")

STEADY = tuple(f"{BENCH}allreduce-cpu8-steady-2026-11-25-run{run}.json" for run in (1, 2, 3))


def steady_against_psum(*runs):
    """(smallest, largest ratio to psum over the runs' cells, the cells faster than psum in every run); the
    last is "N of M" where some cell is not, so that "in all N cells" fails."""
    by_cell = {}
    for run in runs:
        for r in run:
            if r["impl"] == "jaxring":
                by_cell.setdefault((r["bytes"], r["dtype"]), []).append(r["ratio_to_psum"])
    assert all(len(ratios) == len(runs) for ratios in by_cell.values())
    faster = sum(all(ratio > 1 for ratio in ratios) for ratios in by_cell.values())
    low, high = span(ratio for ratios in by_cell.values() for ratio in ratios)
    return low, high, faster if faster == len(by_cell) else f"{faster} of {len(by_cell)}"


# -- the training step on 8 host devices, ring against psum (PERFORMANCE.md, "The training step")

STEP_8 = tuple(f"{BENCH}train-cpu8-inplace-2026-11-25-run{run}.json" for run in (1, 2))


def step_of(run, config, allreduce, key):
    (found,) = [r[key] for r in run if r["config"] == config and r["allreduce"] == allreduce]
    return found


def tiny_step_against_psum(*runs):
    """psum's step time over the ring's, ds2_tiny, each run (with the runs' device and process counts)."""
    (devices,) = {r["local_devices"] for run in runs for r in run}
    (processes,) = {r["processes"] for run in runs for r in run}
    return (devices, processes, *sorted(step_of(run, "ds2_tiny", "psum", "step_s") / step_of(run, "ds2_tiny", "ring", "step_s")
                                        for run in runs))


def sync_alone_against_psum(*runs):
    """psum's all-reduce time over the ring's, ds2_tiny's range over the runs, then ds2_small's."""
    found = []
    for config in ("ds2_tiny", "ds2_small"):
        found += span(step_of(run, config, "psum", "allreduce_s") / step_of(run, config, "ring", "allreduce_s")
                      for run in runs)
    return found


PAIRS = tuple(f"{BENCH}train-{shape}-pair{pair}-cpu2-2026-11-26.json" for pair in (11, 12, 13, 14)
              for shape in ("1x2", "2x1"))


def two_processes_against_one(*runs):
    """The step of 2 processes of 1 device over that of 1 process of 2 devices, each pair: the range."""
    steps = [run[0]["step_s"] for run in runs]
    return span(across / within for within, across in zip(steps[::2], steps[1::2]))


# -- across processes on one node (PERFORMANCE.md, "Across processes")

MPI_1DEV = (f"{BENCH}allreduce-mpi-all-1dev-cpu2-2026-11-26.json",)
MIB = 1 << 20


def against_bare_call(run):
    """jaxring's speed against the bare MPI_Allreduce: range from 1 MiB, range up to 64 KiB."""
    jaxring = [r for r in run if r["impl"] == "jaxring"]
    return (*span(r["speedup_vs_mpi_allreduce"] for r in jaxring if r["bytes"] >= MIB),
            *span(r["speedup_vs_mpi_allreduce"] for r in jaxring if r["bytes"] <= 64 << 10))


def median_of(run, impl, procs, size):
    (found,) = [r["median_s"] for r in run if r["impl"] == impl and r["n_procs"] == procs and r["bytes"] == size]
    return found


def cells(run, impl):
    return sorted({(r["n_procs"], r["bytes"]) for r in run if r["impl"] == impl})


MPI_FINAL = tuple(f"{BENCH}allreduce-mpi-final-cpu2-2026-11-26-run{run}.json" for run in (1, 2, 3))


def at_least_091_from_1mib(*runs):
    """Cells from 1 MiB where jaxring is at least 0.91x the bare call, over the runs; the cells; devices per process."""
    cells = [r for run in runs for r in run if r["impl"] == "jaxring" and r["bytes"] >= MIB]
    return devices_per_process(cells), sum(round(r["speedup_vs_mpi_allreduce"], 2) >= 0.91 for r in cells), len(cells)


def against_mpi4jax(run):
    """Cells where jaxring is faster than mpi4jax, all cells; mpi4jax's range against the bare call."""
    both = cells(run, "mpi4jax")
    faster = sum(median_of(run, "jaxring", *cell) < median_of(run, "mpi4jax", *cell) for cell in both)
    return (faster, len(both), *span(r["speedup_vs_mpi_allreduce"] for r in run if r["impl"] == "mpi4jax"))


def against_gloo(run):
    """gloo's time over jaxring_global's: range up to 256 KiB, range above."""
    ratios = {cell: median_of(run, "jax_gloo", *cell) / median_of(run, "jaxring_global", *cell)
              for cell in cells(run, "jax_gloo")}
    return (*span(v for (_, size), v in ratios.items() if size <= 256 << 10),
            *span(v for (_, size), v in ratios.items() if size > 256 << 10))


# -- over an emulated network (PERFORMANCE.md, "Over an emulated network")

NETWORK = (f"{BENCH}network-cpu2-2026-11-25.json:allreduce",)


def network_cells(run, impl, rate_bps, sizes):
    return {(r["n_procs"], r["bytes"]): r for r in run
            if r["impl"] == impl and r["rate_bps"] == rate_bps and sizes(r["bytes"])}


def stream_share(r):
    """busbw over the TCP stream's rate on the same links."""
    return r["busbw_GBps"] * 8e9 / r["tcp_bits_per_s"]


def network_large(run, rate_bps):
    """>= 16 MiB: jaxring's share of the TCP stream (range), MPI_Allreduce's time over jaxring's (range),
    MPI_Allreduce's share of the stream (range), gloo's time over jaxring's (range)."""
    jaxring, bare, gloo = (network_cells(run, impl, rate_bps, lambda size: size >= 16 * MIB)
                           for impl in ("jaxring", "mpi_bare", "jax_gloo"))
    assert set(jaxring) == set(bare) == set(gloo) and len(jaxring) == 6
    return (*span(map(stream_share, jaxring.values())),
            *span(bare[cell]["median_s"] / jaxring[cell]["median_s"] for cell in jaxring),
            *span(map(stream_share, bare.values())),
            *span(gloo[cell]["median_s"] / jaxring[cell]["median_s"] for cell in jaxring))


def network_small_against_gloo(run):
    """gloo's time over jaxring's: 4-64 KiB at 1 Gbit/s (range), at 10 Gbit/s (range); 256 KiB at 10 Gbit/s
    (range), at 1 Gbit/s (range)."""
    def ratios(rate, sizes):
        jaxring, gloo = (network_cells(run, impl, rate, sizes) for impl in ("jaxring", "jax_gloo"))
        return span(gloo[cell]["median_s"] / jaxring[cell]["median_s"] for cell in jaxring)

    small, at_256k = (lambda size: size <= 64 << 10), (lambda size: size == 256 << 10)
    return (*ratios(1e9, small), *ratios(1e10, small), *ratios(1e10, at_256k), *ratios(1e9, at_256k))


# -- the training step across hosts, three ways (PERFORMANCE.md, "The training step across hosts")

STEP_HOSTS = tuple(f"{BENCH}step-hosts-{name}-2026-11-28.json"
                   for name in ("cpu2", "ds2_tiny-1mib-cpu2", "charlm-cpu2"))


def step_hosts(*runs):
    """gloo's and mpi4jax's step over jaxring's, every host count, link and run: (ratios > 1, ratios,
    ds2_tiny's range, charlm's range)."""
    ratios = {"ds2_tiny": [], "charlm": []}
    for run in runs:
        for r in run:
            model = "ds2_tiny" if "ds2_tiny" in r["config"] else "charlm"
            ratios[model] += [r["step_s"][way] / r["step_s"]["jaxring"] for way in ("lax_gloo", "mpi4jax")]
    every = ratios["ds2_tiny"] + ratios["charlm"]
    return (sum(ratio > 1 for ratio in every), len(every), *span(ratios["ds2_tiny"]), *span(ratios["charlm"]))


# -- 16 bits on the wire (PERFORMANCE.md, "Over an emulated network")

WIRE_BFLOAT16 = (f"{BENCH}network-wire-dtype-2026-11-28.json:runs",)
WIRE_FLOAT16 = (f"{BENCH}network-wire-float16-2026-11-28.json:runs",)


def wire_speedups(runs, dtype):
    """float32's all-reduce time over `dtype`'s on the wire, ds2_tiny, each alternated round."""
    rounds = sorted(name.rsplit("-r", 1)[1] for name in runs if name.startswith(f"wire-{dtype}-r"))
    return [runs[f"wire-float32-r{n}"]["train"][0]["allreduce_s"] / runs[f"wire-{dtype}-r{n}"]["train"][0]["allreduce_s"]
            for n in rounds]


# -- the CUDA ring on one H200 (PERFORMANCE.md, "CUDA ring on one GPU")

H200 = tuple(f"{BENCH}gpu-h200-2026-11-26-run{run}.json" for run in range(1, 8))


def per_call_us(run, engine, ranks, size, path=None):
    return [r["device_us"] for r in run if r["kind"] == "per_call" and r["dtype"] == "float32"
            and r["engine"] == engine and r["ranks"] == ranks and r["bytes"] == size and path in (None, r["path"])]


def sizes_up_to(run, largest):
    return sorted({r["bytes"] for r in run if r["kind"] == "per_call" and r["bytes"] <= largest})


def device_engine_latency(*runs):
    """Host-staged's time over the device engine's best path, 4 KiB to 1 MiB, every run: k = 2's range,
    then k = 8's."""
    found = []
    for ranks in (2, 8):
        found += span(min(per_call_us(run, "host", ranks, size)) / min(per_call_us(run, "device", ranks, size))
                      for run in runs for size in sizes_up_to(run, MIB) if per_call_us(run, "host", ranks, size))
    return found


def host_staged_k8_4kib_ms(*runs):
    return span(us / 1000 for run in runs for us in per_call_us(run, "host", 8, 4 << 10))


# -- the cost model's projection (docs/SCALING.md)

PROJECTION = (f"{BENCH}scaling-projection-2026-11-26.json:projection",)


def efficiency_at_1024(rows):
    """The weak-scaling efficiency at 1024 GPUs, 64 MiB buckets, 8 NICs a node: the lowest and highest of
    the three engines the model fits (host-staged, device, device on the H200)."""
    return span(100 * r["efficiency"] for r in rows
                if r["bucket_MiB"] == 64 and r["gpus"] == 1024 and r["nics"] == 8)


# -- make train, seeds 0-2 (docs/TRAINING.md's table of seeds: no JSON behind it)

SEEDS = ("docs/TRAINING.md#seed | test CER / WER, greedy |",)
VOICES = ("docs/TRAINING.md#seed | test CER / WER greedy (Flite clustergen, held out) |",)


def percent(cell: str, part: int = 0) -> float:
    return float(cell.replace("*", "").split(" / ")[part].split("%")[0])


def make_train_seeds(rows):
    """The seeds' mean greedy test CER, mean beam + LM test CER, training seconds' range, all-reduce share's range."""
    seeds = [row for row in rows if row["seed"].isdigit()]
    assert len(seeds) == 3
    return (statistics.mean(percent(row["test CER / WER, greedy"]) for row in seeds),
            statistics.mean(percent(row["test CER / WER, beam 16 + word 3-gram"]) for row in seeds),
            *span(float(row["training"].split()[0]) for row in seeds),
            *span(percent(row["all-reduce share"]) for row in seeds))


def voices_greedy_mean(rows):
    """make train-voices, seeds 0-2: the mean greedy test CER on the held-out synthesizers."""
    seeds = [row for row in rows if row["seed"].isdigit()]
    assert len(seeds) == 3
    return (statistics.mean(percent(row["test CER / WER greedy (Flite clustergen, held out)"]) for row in seeds),)


# -- the optimizer state split over host devices (PERFORMANCE.md, "The training step")

SHARDED = (f"{BENCH}sharded_time.json",)


def sharded_step(rows):
    """The sharded step's time over the replicated one's (median of the pairs), lowest and highest over models
    and device counts; the optimizer state per device, replicated over sharded, against the devices of every
    process (1 if equal)."""
    shares = {round(r["opt_state_bytes_per_device_replicated"] / r["opt_state_bytes_per_device_sharded"])
              == r["local_devices"] * r.get("processes", 1) for r in rows}
    return (*span(r["ratio_sharded_over_replicated_median"] for r in rows), min(r["local_devices"] for r in rows),
            max(r["local_devices"] for r in rows), 1 if shares == {True} else 0)


SHARDED_HOSTS = tuple(f"{BENCH}step-hosts-sharded-{model}-{devices}dev-cpu2-2026-12-03.json"
                      for model in ("charlm", "charlm_4m") for devices in (1, 2))


def sharded_over_hosts(*runs):
    """Over emulated hosts: the sharded step's time over the replicated one's (each record's median of its alternated
    rounds' ratios), lowest and highest; each node's bytes sent per step, sharded over replicated, lowest and highest."""
    rows = [r for run in runs for r in run]
    return (*span(statistics.median(r["over_jaxring_per_round"]["sharded"]) for r in rows),
            *span(r["wire_bytes_per_step"]["sharded"] / r["wire_bytes_per_step"]["jaxring"] for r in rows))


def seeds_mean_row(rows):
    """The table's own mean (spread) row: greedy mean, lowest, highest; the same beam + LM."""
    seeds = [row for row in rows if row["seed"].isdigit()]
    found = []
    for column in ("test CER / WER, greedy", "test CER / WER, beam 16 + word 3-gram"):
        values = [percent(row[column]) for row in seeds]
        found += [statistics.mean(values), *span(values)]
    return found


# -- make train over mpirun -np 2 on each train.across_processes path (docs/MULTI_NODE.md)
ACROSS_PROCESSES_CER = (BENCH + "across-processes-cer-2026-12-03.json:runs",)


def across_processes_cer(runs):
    """Seed by seed greedy test CER (the same on both paths, else no single number), mean, spread; the beam's."""
    by_seed = {}
    for run in runs:
        by_seed.setdefault(run["seed"], set()).add((run["summary"]["test_cer"], run["summary"]["test_beam_cer"]))
    (greedy, beam) = zip(*(cers.pop() for _, cers in sorted(by_seed.items()) if len(cers) == 1))
    greedy, beam = [100 * g for g in greedy], [100 * b for b in beam]
    return (*greedy, statistics.mean(greedy), max(greedy) - min(greedy), *beam)


# -- small messages in plain jit against mpi4jax, yielding and busy polling, two runs each (docs/PERFORMANCE.md)
def small_message_runs(tag):
    return tuple(BENCH + f"{kind}-{mode}-2026-12-03-quiet-{tag}{run}.json" for kind in ("allreduce-mpi-small", "cg-mpi")
                 for mode in ("yield", "busy") for run in ("", "-run2"))


SMALL_BEFORE, SMALL_AFTER = small_message_runs("ced685c"), small_message_runs("e5aa0f5")


def small_against_mpi4jax(*runs, procs=(2, 4)):
    """mpi4jax's time over jaxring's: the span from 8 B to 4 KiB, at 64 KiB, and of the CG loop."""
    ours = [r for run in runs for r in run if r["n_procs"] in procs]
    lone = [(r["bytes"], r["paired_speedup_vs_mpi4jax"]) for r in ours if r["impl"] == "jaxring_jit"]
    cg = [r["paired_speedup_vs_mpi4jax"] for r in ours if r["impl"] == "cg_jaxring"]
    return (*span(ratio for size, ratio in lone if size <= 4 << 10), *span(ratio for size, ratio in lone if size == 64 << 10),
            *span(cg))


def at_64k_against_the_bare_call(*runs):
    """At 64 KiB: jaxring's span against mpi4jax over 2 processes, then jaxring's and mpi4jax's against the bare call."""
    at = [r for run in runs for r in run if r["bytes"] == 64 << 10]
    return (*span(r["paired_speedup_vs_mpi4jax"] for r in at if r["impl"] == "jaxring_jit" and r["n_procs"] == 2),
            *span(r["paired_speedup_vs_mpi_allreduce"] for r in at if r["impl"] == "jaxring_jit"),
            *span(r["paired_speedup_vs_mpi_allreduce"] for r in at if r["impl"] == "mpi4jax"))


def doubling_or_ring_at_64k(entries):
    """jaxring against mpi4jax at 64 KiB over 4 processes: the ring's span, doubling's, and the pairs run."""
    def ratios(variant):
        return [r["paired_speedup_vs_mpi4jax"] for e in entries if e["sizes"] == "64K" and e["variant"] == variant
                for r in e["records"] if r["impl"] == "jaxring_jit"]
    ring, doubling = ratios("ring"), ratios("doubling")
    assert len(ring) == len(doubling)
    return (*span(ring), *span(doubling), len(ring))


CLAIMS = [
    Claim("README.md", r"8 host devices \(a test setting: 8 devices on 2 cores\) \| `lax.psum` \| "
          r"\[([\d.]+)-([\d.]+)x in all (\d+) cells\]", STEADY, steady_against_psum),
    Claim("docs/PERFORMANCE.md", r"Faster than psum in all (\d+) cells of each run: ([\d.]+)-([\d.]+)x per op in a program",
          STEADY, lambda *runs: (lambda low, high, count: (count, low, high))(*steady_against_psum(*runs))),
    Claim("README.md", r"CPU, ds2_tiny's training step, (\d+) host devices in (\d+) process \| `lax.psum` \| "
          r"\[([\d.]+)x and ([\d.]+)x\]", STEP_8, tiny_step_against_psum),
    Claim("docs/PERFORMANCE.md", r"The sync alone is ([\d.]+)-([\d.]+)x faster with the ring for ds2_tiny, "
          r"([\d.]+)-([\d.]+)x for ds2_small", STEP_8, sync_alone_against_psum),
    Claim("docs/PERFORMANCE.md", r"from 1 MiB\): ([\d.]+)-([\d.]+)x from 1 MiB, ([\d.]+)-([\d.]+)x up to 64 KiB in this run",
          MPI_1DEV, against_bare_call),
    Claim("docs/PERFORMANCE.md", r"jaxring is faster in (\d+) of (\d+) cells \(not at 4 KiB on 2 x 1\); mpi4jax is "
          r"([\d.]+)-([\d.]+)x as fast as the bare call", MPI_1DEV, against_mpi4jax),
    Claim("docs/PERFORMANCE.md", r"Against JAX's gloo psum\*\*: (\d+)-(\d+)x faster up to 256 KiB, (\d+)-(\d+)x above",
          MPI_1DEV, against_gloo),
    Claim("README.md", r"JAX's gloo psum \| \[(\d+)-(\d+)x up to 256 KiB, (\d+)-(\d+)x above\]", MPI_1DEV, against_gloo),
    Claim("docs/PERFORMANCE.md", r"\*\*met\*\* on 2, 3 and 4 nodes: ([\d.]+)-([\d.]+) of the stream, ([\d.]+)-([\d.]+)x "
          r"MPI_Allreduce \(which reaches ([\d.]+)-([\d.]+) of the stream\)\. Gloo's psum is within ([\d.]+)-([\d.]+)x",
          NETWORK, lambda run: network_large(run, 1e9)),
    Claim("README.md", r"2-4 emulated nodes at 1 Gbit/s \(1 process of (\d) device each\), >= 16 MiB \| `MPI_Allreduce` \| "
          r"\[([\d.]+)-([\d.]+)x; ([\d.]+)-([\d.]+) of a TCP stream's rate\]", NETWORK,
          lambda run: (devices_per_process(run),
                       *(lambda low, high, mpi_low, mpi_high, *_: (mpi_low, mpi_high, low, high))(*network_large(run, 1e9)))),
    Claim("docs/PERFORMANCE.md", r"jaxring's step was faster in (\d+) of (\d+) ratios: ([\d.]+)-([\d.]+)x for ds2_tiny, "
          r"([\d.]+)-([\d.]+)x for charlm", STEP_HOSTS, step_hosts),
    Claim("README.md", r"\[([\d.]+)-([\d.]+)x \(ds2_tiny\), ([\d.]+)-([\d.]+)x \(charlm, a transformer LM\): "
          r"faster in (\d+) of (\d+)\]", STEP_HOSTS,
          lambda *runs: (lambda faster, total, *ranges: (*ranges, faster, total))(*step_hosts(*runs))),
    Claim("README.md", r"\[([\d.]+)-([\d.]+)x with `train.allreduce_dtype: float16`\].*? ([\d.]+)-([\d.]+)x with bfloat16 at",
          WIRE_FLOAT16 + WIRE_BFLOAT16,
          lambda f16, bf16: (*span(wire_speedups(f16, "float16")), *span(wire_speedups(bf16, "bfloat16")))),
    Claim("docs/PERFORMANCE.md", r"and ([\d.]+)-([\d.]+)x in float16 for ds2_tiny", WIRE_FLOAT16,
          lambda runs: span(1 / ratio for ratio in wire_speedups(runs, "float16"))),
    Claim("docs/PERFORMANCE.md", r"the device engine is ([\d.]+)-([\d.]+)x faster than host-staged at k = 2 and "
          r"([\d.]+)-([\d.]+)x at k = 8 \(4 KiB to 1 MiB, best path, every run\)", H200, device_engine_latency),
    Claim("README.md", r"one H200, k virtual ranks \| the default host-staged engine \| \[device engine ([\d.]+)-([\d.]+)x "
          r"up to 1 MiB\]", H200, lambda *runs: (lambda low, _, __, high: (low, high))(*device_engine_latency(*runs))),
    Claim("README.md", r"4 KiB: the default host-staged engine, \[([\d.]+)-([\d.]+) ms\]", H200, host_staged_k8_4kib_ms),
    Claim("README.md", r"CPU, 2-4 processes of (\d+) device on one node \| bare `MPI_Allreduce` \| \[0.91x or more from 1 MiB "
          r"in (\d+) of (\d+) cells\]\([^)]*\) per three runs", MPI_FINAL, at_least_091_from_1mib),
    Claim("README.md", r"\[([\d.]+)% test CER greedy, ([\d.]+)% with a word 3-gram; (\d+)-(\d+) s of training; "
          r"all-reduce ([\d.]+)-([\d.]+)% of the step\]", SEEDS, make_train_seeds),
    Claim("docs/TRAINING.md", r"\| mean \(spread\) \| \*\*([\d.]+)%\*\* \(([\d.]+)-([\d.]+)\) \| \*\*([\d.]+)%\*\* "
          r"\(([\d.]+)-([\d.]+)\) \| [\d.]+% \| \| \| \| \|", SEEDS, seeds_mean_row),
    Claim("docs/PERFORMANCE.md", r"The step across processes is ([\d.]+)-([\d.]+)x the in-process one", PAIRS,
          two_processes_against_one),
    Claim("docs/CUDA_RING.md", r"the device-synchronised engine, ([\d.]+)-([\d.]+)x faster up to 1 MiB there", H200,
          lambda *runs: (lambda low, _, __, high: (low, high))(*device_engine_latency(*runs))),
    Claim("README.md", r"ds2_paper on 1024 H100s \(cost model, 64 MiB buckets\) \| \[(\d+)% weak-scaling efficiency\]",
          PROJECTION, lambda rows: efficiency_at_1024(rows)[:1]),
    Claim("docs/SCALING.md", r"and (\d+)% at 1024 for all three", PROJECTION, lambda rows: efficiency_at_1024(rows)[:1]),
    Claim("docs/SCALING.md", r"and (\d+)% at 1024 for all three", PROJECTION, lambda rows: efficiency_at_1024(rows)[1:]),
    Claim("docs/PERFORMANCE.md", r"16 MiB at 10 Gbit/s: not met\*\* \(([\d.]+)-([\d.]+) of the stream, ([\d.]+)-([\d.]+)x "
          r"MPI_Allreduce\)", NETWORK, lambda run: network_large(run, 1e10)[:4]),
    Claim("docs/PERFORMANCE.md", r"met from 4 to 64 KiB \((\d+)-(\d+)x at 1 Gbit/s, (\d+)-(\d+)x at 10 Gbit/s\) and at 256 KiB "
          r"on 10 Gbit/s \(([\d.]+)-(\d+)x\)\. Not met at 256 KiB on 1 Gbit/s \(([\d.]+)-([\d.]+)x",
          NETWORK, network_small_against_gloo),
    Claim("README.md", r"`make train-voices` \(held-out synthesizers\) \| \[([\d.]+)% test CER greedy, seeds 0-2", VOICES,
          voices_greedy_mean),
    Claim("README.md", r"CPU, (\d+)-(\d+) host devices, adamw's state split over them \(`train.shard_optimizer`\) \| the replicated "
          r"step \| \[(1)/N of the optimizer state per device; step ([\d.]+)-([\d.]+)x", SHARDED,
          lambda rows: (lambda low, high, fewest, most, shares: (fewest, most, shares, low, high))(*sharded_step(rows))),
    Claim("docs/PERFORMANCE.md", r"the sharded step took ([\d.]+)-([\d.]+)x the replicated one's time \(each row's median of its rounds\), and each node's "
          r"link sent ([\d.]+)-([\d.]+)x its bytes", SHARDED_HOSTS, sharded_over_hosts),
    Claim("README.md", r"Over 2-4 emulated hosts \[([\d.]+)-([\d.]+)x at the same bytes on the wire\]", SHARDED_HOSTS,
          lambda *runs: sharded_over_hosts(*runs)[:2]),
    Claim("README.md", r"CG loop \(two scalar sums per iteration\) \| mpi4jax \| \[([\d.]+)-([\d.]+)x from 8 B to 4 KiB, "
          r"([\d.]+)-([\d.]+)x at 64 KiB; CG ([\d.]+)-([\d.]+)x\]", SMALL_AFTER, small_against_mpi4jax),
    Claim("docs/PERFORMANCE.md", r"From 8 B to 4 KiB jaxring is faster than mpi4jax in every cell \(([\d.]+)-([\d.]+)x\), and "
          r"the CG loop by ([\d.]+)-([\d.]+)x\. 64 KiB over 4 processes: ([\d.]+)-([\d.]+)x, was ([\d.]+)-([\d.]+)x",
          SMALL_BEFORE + SMALL_AFTER,
          lambda *runs: (*small_against_mpi4jax(*runs[8:])[:2], *small_against_mpi4jax(*runs[8:])[4:],
                         *small_against_mpi4jax(*runs[8:], procs=(4,))[2:4], *small_against_mpi4jax(*runs[:8], procs=(4,))[2:4])),
    Claim("docs/PERFORMANCE.md", r"64 KiB over 2 processes \(the ring, unchanged\): ([\d.]+)-([\d.]+)x\. At 64 KiB the cost is MPI's own: "
          r"in the same runs jaxring was ([\d.]+)-([\d.]+)x as fast as the bare MPI_Allreduce \(mpi4py, one call per op\), "
          r"mpi4jax ([\d.]+)-([\d.]+)x", SMALL_AFTER[:4], at_64k_against_the_bare_call),
    Claim("docs/PERFORMANCE.md", r"alternated runs at that size alone gave the ring ([\d.]+)-([\d.]+)x and doubling "
          r"([\d.]+)-([\d.]+)x \((\d+) pairs\)", (BENCH + "doubling-or-ring-4proc-2026-12-03-dc5ab8a.json",),
          doubling_or_ring_at_64k),
    Claim("docs/MULTI_NODE.md", r"CER was the same too: ([\d.]+)%, ([\d.]+)% and ([\d.]+)% greedy \(mean ([\d.]+)%, spread ([\d.]+) points\), "
          r"([\d.]+)%, ([\d.]+)% and ([\d.]+)% by beam search", ACROSS_PROCESSES_CER, across_processes_cer),
]
