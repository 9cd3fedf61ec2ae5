"""Character and word error rates over a corpus (total edits / total reference length)."""

import jiwer


def _check(refs, hyps):
    refs, hyps = list(refs), list(hyps)
    if len(refs) != len(hyps):
        raise ValueError(f"got {len(refs)} references but {len(hyps)} hypotheses; pass one of each per utterance")
    if not refs or not any(refs):
        raise ValueError("error rates need at least one non-empty reference transcript")
    return refs, hyps


def cer(refs, hyps) -> float:
    """Character error rate of hypotheses `hyps` against references `refs`."""
    refs, hyps = _check(refs, hyps)
    return float(jiwer.cer(refs, hyps))


def wer(refs, hyps) -> float:
    """Word error rate of hypotheses `hyps` against references `refs`."""
    refs, hyps = _check(refs, hyps)
    return float(jiwer.wer(refs, hyps))
