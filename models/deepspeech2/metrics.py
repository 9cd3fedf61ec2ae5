"""Character and word error rates over a corpus (total edits / total reference length).

Evaluation sums edit_counts() over batches (and processes) before taking
error_rates(), so a corpus's rate weighs every character equally.
"""


def _check(refs, hyps):
    refs, hyps = list(refs), list(hyps)
    if len(refs) != len(hyps):
        raise ValueError(f"got {len(refs)} references but {len(hyps)} hypotheses; pass one of each per utterance")
    return refs, hyps


def edit_counts(refs, hyps) -> dict[str, int]:
    """Additive counts: character and word edits of `hyps` against `refs`, and the references' lengths."""
    import jiwer  # here, not at the top: the training step builds without it (scripts/gpu/gpu_check.sh's image)

    refs, hyps = _check(refs, hyps)
    chars = jiwer.process_characters(refs, hyps)
    words = jiwer.process_words(refs, hyps)
    return {
        "char_edits": chars.substitutions + chars.deletions + chars.insertions,
        "chars": chars.hits + chars.substitutions + chars.deletions,
        "word_edits": words.substitutions + words.deletions + words.insertions,
        "words": words.hits + words.substitutions + words.deletions,
    }


def error_rates(counts: dict[str, float]) -> dict[str, float]:
    """{"cer", "wer"} from summed edit_counts()."""
    if not counts.get("chars"):
        raise ValueError("error rates need at least one non-empty reference transcript; check the manifest")
    return {"cer": counts["char_edits"] / counts["chars"], "wer": counts["word_edits"] / counts["words"]}


def cer(refs, hyps) -> float:
    """Character error rate of hypotheses `hyps` against references `refs`."""
    return error_rates(edit_counts(refs, hyps))["cer"]


def wer(refs, hyps) -> float:
    """Word error rate of hypotheses `hyps` against references `refs`."""
    return error_rates(edit_counts(refs, hyps))["wer"]
