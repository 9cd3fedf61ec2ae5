"""Batches for pmap: SortaGrad, length buckets, per-process shards, background prefetch.

The order of a whole epoch is a pure function of (seed, epoch) and the global batch size,
so every process computes the same global batches without talking to the others and takes
its contiguous slice of each; within a process, local device d takes the d-th slice of
that. The global batch is therefore the same however it is split across processes and
devices, and a run resumed from state() sees exactly the batches it would have seen.
"""

import concurrent.futures
import logging
import queue
import threading

import numpy as np

from models.deepspeech2.data import problems as P
from models.deepspeech2.data.dataset import Example, SpeechDataset

log = logging.getLogger(__name__)


def round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def epoch_batches(durations: np.ndarray, epoch: int, *, seed: int, global_batch: int,
                  sortagrad: bool = True, shuffle: bool = True, drop_last: bool = True,
                  sort_window: int = 32) -> list[np.ndarray]:
    """Utterance indices of each global batch of an epoch, in the order they are visited.

    SortaGrad (epoch 0 with sortagrad, or any epoch without shuffle): all utterances in
    increasing duration. Otherwise: a seeded permutation, sorted by duration inside windows
    of `sort_window` batches so that each batch holds similar lengths (little padding),
    then the batches themselves shuffled.
    """
    n = len(durations)
    if not shuffle or (sortagrad and epoch == 0):
        order = np.argsort(durations, kind="stable")
        rng = None
    else:
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(n)
        window = global_batch * sort_window
        order = np.concatenate([
            chunk[np.argsort(durations[chunk], kind="stable")]
            for chunk in np.split(order, range(window, n, window))
        ]) if n else order
    end = n - n % global_batch if drop_last else n
    batches = [order[i:i + global_batch] for i in range(0, end, global_batch)]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


class BatchIterator:
    """Endless (or num_epochs) iterator of batch dicts shaped for pmap over local devices.

    Each batch, for D = local_devices and B = per_device_batch:
      features         float32 [D, B, T, F]  T a multiple of pad_frames_to, F the dataset's num_features
      feature_lengths  int32   [D, B]
      labels           int32   [D, B, L]       0-padded, L a multiple of pad_labels_to
      label_lengths    int32   [D, B]
      weights          float32 [D, B]          1 for a real utterance, 0 for a row that only
                                               fills the shape (see below)
      texts            list of D*B str, device-major (normalised transcripts, "" for fillers)
      paths            list of D*B str, device-major: the audio file of each row ("" for fillers)
    T and L are set by the whole global batch, so they agree across processes.

    A row whose audio turns out unreadable is filled with a copy of another row of the same
    device (weight 0), so shapes never change; the last, partial batch of an epoch with
    drop_last=False is filled with empty rows (weight 0, lengths 0).

    Batches are made by a background thread; use the iterator in a `with` block (or call
    close()) so that the thread stops when you are done with it.
    """

    def __init__(self, dataset: SpeechDataset, *, per_device_batch: int, local_devices: int = 1,
                 process_index: int = 0, process_count: int = 1, seed: int = 0,
                 sortagrad: bool = True, shuffle: bool = True, drop_last: bool = True,
                 num_epochs: int | None = None, pad_frames_to: int = 64, pad_labels_to: int = 16,
                 sort_window: int = 32, prefetch: int = 4, workers: int = 2):
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index {process_index} is not in [0, {process_count})")
        if min(per_device_batch, local_devices, pad_frames_to, pad_labels_to, prefetch, workers) < 1:
            raise ValueError("batch sizes, device counts, padding multiples, prefetch and "
                             "workers must all be >= 1")
        self.dataset = dataset
        self.local_devices, self.per_device_batch = local_devices, per_device_batch
        self.process_batch = local_devices * per_device_batch
        self.global_batch = self.process_batch * process_count
        self.process_index = process_index
        self.num_epochs = num_epochs
        self._order = dict(seed=seed, global_batch=self.global_batch, sortagrad=sortagrad,
                           shuffle=shuffle, drop_last=drop_last, sort_window=sort_window)
        self.pad_frames_to, self.pad_labels_to = pad_frames_to, pad_labels_to
        self.batches_per_epoch = len(epoch_batches(dataset.durations, 0, **self._order))
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"{len(dataset)} usable utterances make no global batch of {self.global_batch}; "
                "use a smaller batch, more data, or drop_last=False"
            )
        self._prefetch, self._workers = prefetch, workers
        self._position = (0, 0)  # (epoch, index of the next batch to hand out)
        self._thread = None
        self.epoch_summaries: list[str] = []
        log.info("dataset: %d utterances usable, %s", len(dataset),
                 P.describe(dataset.problems.snapshot()))

    # -- resumable position ---------------------------------------------------------------

    def state(self) -> dict[str, int]:
        """Position of the next batch; restore() it to continue exactly from there."""
        epoch, index = self._position
        return {"epoch": epoch, "index": index}

    def restore(self, state: dict[str, int]) -> None:
        epoch, index = int(state["epoch"]), int(state["index"])
        if not (epoch >= 0 and 0 <= index <= self.batches_per_epoch):
            raise ValueError(f"cannot restore {state}: an epoch has {self.batches_per_epoch} batches")
        self.close()
        self._position = (epoch, index)

    # -- iteration --------------------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self._thread is None:
            self._start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        if item is None:
            self.close()
            raise StopIteration
        epoch, index, batch = item
        self._position = (epoch + 1, 0) if index + 1 == self.batches_per_epoch else (epoch, index + 1)
        return batch

    def close(self) -> None:
        """Stops the prefetch thread (iteration restarts from state() on the next call)."""
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
        self._pool.shutdown()
        self._thread = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self._prefetch)
        self._pool = concurrent.futures.ThreadPoolExecutor(self._workers)
        self._thread = threading.Thread(target=self._produce, args=self._position,
                                        name="speech-batches", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def _produce(self, epoch: int, index: int) -> None:
        try:
            while self.num_epochs is None or epoch < self.num_epochs:
                batches = epoch_batches(self.dataset.durations, epoch, **self._order)
                before = self.dataset.problems.snapshot()
                frames = padded = 0
                for i in range(index, len(batches)):
                    batch = self._assemble(batches[i])
                    frames += int(batch["feature_lengths"].sum())
                    padded += batch["feature_lengths"].size * batch["features"].shape[2]
                    if not self._put((epoch, i, batch)):
                        return
                self._summarise(epoch, len(batches) - index, frames, padded, before)
                epoch, index = epoch + 1, 0
            self._put(None)
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._put(e)

    def _summarise(self, epoch, batches, frames, padded, before) -> None:
        counts = self.dataset.problems.snapshot()
        counts.subtract(before)
        padding = 1 - frames / padded if padded else 0.0
        summary = (f"data epoch {epoch}: {batches} batches of {self.global_batch}, "
                   f"padding {padding:.1%} of frames, {P.describe(+counts)}")
        self.epoch_summaries.append(summary)
        log.info(summary)

    # -- one batch --------------------------------------------------------------------------

    def _assemble(self, global_indices: np.ndarray) -> dict:
        """This process's part of one global batch, loaded, padded and shaped [D, B, ...]."""
        start = self.process_index * self.process_batch
        local = global_indices[start:start + self.process_batch]
        examples = list(self._pool.map(self.dataset.load, local))
        rows = self._fill_failures(examples)
        d = self.dataset
        max_frames = max([int(d.expected_frames[global_indices].max())]
                         + [len(r.features) for r, _ in rows if r is not None])
        frames = round_up(max_frames, self.pad_frames_to)
        label_len = round_up(int(d.label_lengths[global_indices].max()), self.pad_labels_to)

        n = self.process_batch
        batch = {
            "features": np.zeros((n, frames, d.num_features), np.float32),
            "feature_lengths": np.zeros(n, np.int32),
            "labels": np.zeros((n, label_len), np.int32),
            "label_lengths": np.zeros(n, np.int32),
            "weights": np.zeros(n, np.float32),
        }
        texts, paths = [""] * n, [""] * n
        for j, (example, weight) in enumerate(rows):
            if example is None:
                continue
            batch["features"][j, :len(example.features)] = example.features
            batch["feature_lengths"][j] = len(example.features)
            batch["labels"][j, :len(example.labels)] = example.labels
            batch["label_lengths"][j] = len(example.labels)
            batch["weights"][j] = weight
            texts[j] = example.text if weight else ""
            paths[j] = d.paths[local[j]] if weight else ""
        batch = {k: v.reshape(self.local_devices, self.per_device_batch, *v.shape[1:])
                 for k, v in batch.items()}
        batch["texts"], batch["paths"] = texts, paths
        return batch

    def _fill_failures(self, examples: list[Example | None]) -> list[tuple[Example | None, float]]:
        """(example, weight) per row: failed rows borrow a good row of their device (else of the
        process) with weight 0, so shapes stay fixed; rows past a partial batch stay empty."""
        rows = [(e, 1.0) for e in examples] + [(None, 0.0)] * (self.process_batch - len(examples))
        good = [e for e in examples if e is not None]
        for j, example in enumerate(examples):
            if example is None:
                device = j // self.per_device_batch
                same_device = [e for e in examples[device * self.per_device_batch:
                                                   (device + 1) * self.per_device_batch]
                               if e is not None]
                donors = same_device or good
                rows[j] = (donors[0], 0.0) if donors else (None, 0.0)
        return rows
