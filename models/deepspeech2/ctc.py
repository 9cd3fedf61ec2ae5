"""CTC loss over padded batches, with utterances that cannot be aligned reported, not averaged in."""

import jax.numpy as jnp
import optax

from models.deepspeech2.alphabet import BLANK


def frames_needed(labels, label_lengths):
    """Fewest output frames a CTC alignment of each label needs: one per symbol, plus a
    blank between each pair of equal neighbours."""
    positions = jnp.arange(labels.shape[1] - 1)[None, :]
    repeats = (labels[:, 1:] == labels[:, :-1]) & (positions + 1 < label_lengths[:, None])
    return label_lengths + repeats.sum(axis=1).astype(label_lengths.dtype)


def ctc_loss(logits, out_lengths, labels, label_lengths):
    """Per-utterance CTC negative log-likelihood and a feasibility mask.

    logits [B, T, 29] (unnormalised), out_lengths [B] real frames, labels [B, L]
    int32 padded with 0, label_lengths [B]. Returns (loss [B], feasible [B] bool):
    utterances whose label needs more frames than they have get loss 0 (and no
    gradient) with feasible False; average with `loss.sum() / feasible.sum()`
    and log `(~feasible).sum()`.
    """
    out_lengths = jnp.asarray(out_lengths)
    label_lengths = jnp.asarray(label_lengths)
    logit_paddings = (jnp.arange(logits.shape[1])[None, :] >= out_lengths[:, None]).astype(jnp.float32)
    label_paddings = (jnp.arange(labels.shape[1])[None, :] >= label_lengths[:, None]).astype(jnp.float32)
    loss = optax.ctc_loss(logits, logit_paddings, labels, label_paddings, blank_id=BLANK)
    feasible = frames_needed(labels, label_lengths) <= out_lengths
    return jnp.where(feasible, loss, 0.0), feasible
