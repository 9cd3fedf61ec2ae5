"""Epoch order, batch shapes, sharding across processes and devices, resume, prefetch."""

import numpy as np
import pytest

from models.deepspeech2 import alphabet
from models.deepspeech2.data import audio, features, manifest
from models.deepspeech2.data.batching import BatchIterator, epoch_batches
from models.deepspeech2.data.dataset import SpeechDataset

ARRAYS = ("features", "feature_lengths", "labels", "label_lengths", "weights")


@pytest.fixture(scope="module")
def train_set(tiny_corpus):
    return SpeechDataset(manifest.read_manifest(str(tiny_corpus / "train.jsonl")))


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def assert_batches_equal(a, b):
    for key in ARRAYS:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert a["texts"] == b["texts"]


# -- epoch order -----------------------------------------------------------------------------


def padded_frames(durations, batches):
    return sum(len(b) * durations[b].max() for b in batches)


def test_sortagrad_first_epoch_in_increasing_duration():
    durations = np.random.default_rng(0).uniform(1, 15, 103)
    batches = epoch_batches(durations, 0, seed=1, global_batch=8, drop_last=False)
    order = np.concatenate(batches)
    assert sorted(order) == list(range(103))
    assert np.all(np.diff(durations[order]) >= 0)
    assert [len(b) for b in batches] == [8] * 12 + [7]


def test_later_epochs_shuffled_and_deterministic():
    durations = np.random.default_rng(0).uniform(1, 15, 1000)
    kwargs = dict(seed=3, global_batch=10, sort_window=4)
    one = epoch_batches(durations, 1, **kwargs)
    assert len(one) == 100 and sorted(np.concatenate(one)) == list(range(1000))
    assert all(np.array_equal(a, b) for a, b in zip(one, epoch_batches(durations, 1, **kwargs)))
    two = epoch_batches(durations, 2, **kwargs)
    other_seed = epoch_batches(durations, 1, **{**kwargs, "seed": 4})
    assert not np.array_equal(np.concatenate(one), np.concatenate(two))
    assert not np.array_equal(np.concatenate(one), np.concatenate(other_seed))
    assert not np.all(np.diff(durations[np.concatenate(one)]) >= 0)


def test_length_buckets_cut_padding():
    durations = np.random.default_rng(1).uniform(1, 15, 2000)
    bucketed = epoch_batches(durations, 1, seed=0, global_batch=16, sort_window=32)
    unsorted = epoch_batches(durations, 1, seed=0, global_batch=16, sort_window=1)
    real = durations.sum()
    assert padded_frames(durations, bucketed) / real < 1.05
    assert padded_frames(durations, unsorted) / real > 1.5


def test_drop_last_and_no_shuffle():
    durations = np.arange(23, 0, -1, dtype=float)
    kept = epoch_batches(durations, 5, seed=0, global_batch=5, shuffle=False)
    assert [list(b) for b in kept] == [[22, 21, 20, 19, 18], [17, 16, 15, 14, 13],
                                       [12, 11, 10, 9, 8], [7, 6, 5, 4, 3]]


# -- batches -----------------------------------------------------------------------------------


def test_batch_shapes_and_contents(train_set):
    with BatchIterator(train_set, per_device_batch=3, local_devices=2, pad_frames_to=64,
                       pad_labels_to=16) as batches:
        batch = next(batches)
    d, b = 2, 3
    frames, label_len = batch["features"].shape[2], batch["labels"].shape[2]
    assert batch["features"].shape == (d, b, frames, features.NUM_BINS)
    assert frames % 64 == 0 and label_len % 16 == 0
    assert batch["features"].dtype == np.float32 and batch["weights"].dtype == np.float32
    for key in ("feature_lengths", "labels", "label_lengths"):
        assert batch[key].dtype == np.int32
    order = epoch_batches(train_set.durations, 0, seed=0, global_batch=6)[0]
    assert len(batch["texts"]) == 6
    for j, index in enumerate(order):
        dev, row = divmod(j, b)
        want = features.featurize(audio.read_audio(train_set.paths[index])[0])
        n = batch["feature_lengths"][dev, row]
        assert n == len(want)
        np.testing.assert_array_equal(batch["features"][dev, row, :n], want)
        assert not batch["features"][dev, row, n:].any()
        text = batch["texts"][j]
        assert text == train_set.texts[index]
        labels = batch["labels"][dev, row]
        np.testing.assert_array_equal(labels[:len(text)], alphabet.encode(text))
        assert batch["label_lengths"][dev, row] == len(text) and not labels[len(text):].any()
    assert (batch["weights"] == 1).all()


@pytest.mark.parametrize("processes,devices,per_device", [(2, 2, 2), (1, 8, 1), (4, 1, 2)])
def test_global_batch_independent_of_split(train_set, processes, devices, per_device):
    kwargs = dict(seed=5, num_epochs=2, pad_frames_to=32)
    with BatchIterator(train_set, per_device_batch=8, **kwargs) as whole:
        reference = list(whole)
    shards = []
    for rank in range(processes):
        with BatchIterator(train_set, per_device_batch=per_device, local_devices=devices,
                           process_index=rank, process_count=processes, **kwargs) as shard:
            shards.append(list(shard))
    assert len(reference) == 4 and all(len(s) == 4 for s in shards)
    for i, want in enumerate(reference):
        joined = {k: np.concatenate([s[i][k].reshape(-1, *s[i][k].shape[2:]) for s in shards])[None]
                  for k in ARRAYS}
        joined["texts"] = sum((s[i]["texts"] for s in shards), [])
        assert_batches_equal(joined, want)


def test_same_seed_same_batches_and_resume(train_set):
    kwargs = dict(per_device_batch=2, local_devices=2, seed=9, prefetch=2)
    with BatchIterator(train_set, **kwargs) as straight:
        expected = take(straight, 12)  # 5 batches an epoch: crosses two epoch boundaries
    with BatchIterator(train_set, **kwargs) as first:
        take(first, 4)
        assert first.state() == {"epoch": 0, "index": 4}
        take(first, 3)
        state = first.state()
    assert state == {"epoch": 1, "index": 2} and all(isinstance(v, int) for v in state.values())
    with BatchIterator(train_set, **kwargs) as resumed:
        resumed.restore(state)
        for want in expected[7:]:
            assert_batches_equal(next(resumed), want)


def test_restore_rejects_positions_past_the_epoch(train_set):
    batches = BatchIterator(train_set, per_device_batch=4)
    with pytest.raises(ValueError, match="an epoch has 5 batches"):
        batches.restore({"epoch": 0, "index": 6})


def test_evaluation_pass_keeps_every_utterance(train_set):
    with BatchIterator(train_set, per_device_batch=3, local_devices=2, shuffle=False,
                       drop_last=False, num_epochs=1) as batches:
        seen = list(batches)
    assert len(seen) == 4  # 20 utterances, 6 a batch
    texts = [t for b in seen for t, w in zip(b["texts"], b["weights"].ravel()) if w]
    assert sorted(texts) == sorted(train_set.texts)
    last = seen[-1]
    assert last["weights"].ravel().tolist() == [1, 1, 0, 0, 0, 0]
    assert not last["feature_lengths"].ravel()[2:].any() and last["texts"][2:] == [""] * 4


def test_too_few_utterances_for_a_batch(train_set):
    with pytest.raises(ValueError, match="make no global batch of 32"):
        BatchIterator(train_set, per_device_batch=4, local_devices=8)


def test_padding_fraction_reported(train_set):
    with BatchIterator(train_set, per_device_batch=4, num_epochs=1) as batches:
        list(batches)
    (summary,) = batches.epoch_summaries
    assert summary.startswith("data epoch 0: 5 batches of 4, padding ")
    assert "nothing skipped" in summary
