"""ARPA n-gram models: reading against hand-computed back-off, Witten-Bell against brute force."""

import math

import numpy as np
import pytest

from models.deepspeech2.lm import BOS, EOS, SPACE, UNK, ArpaError, ArpaLM, train_witten_bell, transcript_tokens

TINY_ARPA = """
\\data\\
ngram 1=5
ngram 2=3

\\1-grams:
-1.0\t<unk>
-99\t<s>\t-0.5
-0.5\ta\t-0.3
-0.7\tb
-0.6\t</s>

\\2-grams:
-0.2\t<s> a
-0.4\ta b
-0.1\ta </s>

\\end\\
"""


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.arpa"
    path.write_text(TINY_ARPA)
    return ArpaLM.read(path)


@pytest.mark.parametrize("context, token, log10", [
    ([BOS], "a", -0.2),  # listed bigram
    ([BOS], "b", -0.5 - 0.7),  # back-off weight of <s> + unigram b
    (["a"], "b", -0.4),
    (["a"], "a", -0.3 - 0.5),
    (["b"], EOS, 0.0 - 0.6),  # b has no back-off weight: 0
    (["a"], "zebra", -0.3 - 1.0),  # unknown word: <unk>
    ([BOS, "b", "a", "b", "a"], "b", -0.4),  # a bigram model looks at the last word only
])
def test_arpa_back_off_matches_hand_computed_probabilities(tiny, context, token, log10):
    assert tiny.log10_prob(context, token) == pytest.approx(log10)
    assert tiny.log_prob(context, token) == pytest.approx(log10 * math.log(10))


def test_a_word_model_scores_words_as_they_end(tiny):
    ln10 = math.log(10)
    assert tiny.unit == "word" and tiny.order == 2
    assert tiny.score("a b") == pytest.approx((-0.2 - 0.4 - 0.6) * ln10)
    # incremental: nothing while a word is typed, the word at the space, the rest at the end
    assert tiny.extend("", "a") == tiny.extend("a", "b") == tiny.extend("a ", " ") == 0.0
    assert tiny.extend("a", " ") == pytest.approx(-0.2 * ln10)
    assert tiny.extend("a ", " ") + tiny.finish("a b") == pytest.approx((-0.4 - 0.6) * ln10)
    assert tiny.finish("a ") == pytest.approx(-0.1 * ln10)
    assert tiny.finish("") == pytest.approx((-0.5 - 0.6) * ln10)


def test_arpa_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.arpa"
    path.write_text(TINY_ARPA.replace("-0.4\ta b", "-0.4\ta b c d"))
    with pytest.raises(ArpaError, match=r"bad\.arpa:15: a 2-gram line"):
        ArpaLM.read(path)
    path.write_text(TINY_ARPA.replace("ngram 2=3", "ngram 2=4"))
    with pytest.raises(ArpaError, match="declares 4 2-grams, the file lists 3"):
        ArpaLM.read(path)
    path.write_text("just some words\n")
    with pytest.raises(ArpaError, match="no \\\\data\\\\ section"):
        ArpaLM.read(path)


def brute_force_witten_bell(sentences, order):
    """Interpolated Witten-Bell straight from the definition, recomputed for every query."""
    events = []
    for sentence in sentences:
        tokens = [BOS, *sentence, EOS]
        events += [(tuple(tokens[max(0, i - order + 1):i]), tokens[i]) for i in range(1, len(tokens))]
    vocabulary = {w for _, w in events} | {UNK}

    def prob(context, token):
        if not context:
            lower = 1 / len(vocabulary)
        else:
            lower = prob(context[1:], token)
        after = [w for h, w in events if h[len(h) - len(context):] == context and len(h) >= len(context)]
        if not after:
            return lower
        distinct = len(set(after))
        return (after.count(token) + distinct * lower) / (len(after) + distinct)

    return prob, vocabulary


@pytest.mark.parametrize("unit, order", [("char", 1), ("char", 3), ("word", 2), ("word", 3)])
def test_witten_bell_written_as_arpa_equals_the_definition(tmp_path, unit, order):
    rng = np.random.default_rng(order)
    words = ["the", "cat", "sat", "a", "hat", "it's"]
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 5))) for _ in range(12)]
    sentences = [transcript_tokens(t, unit) for t in texts]
    path = tmp_path / "lm.arpa"
    train_witten_bell(sentences, order).write(path)
    lm = ArpaLM.read(path)
    assert lm.unit == unit and lm.order == order
    reference, vocabulary = brute_force_witten_bell(sentences, order)
    predicted = sorted(vocabulary) + [EOS] * (EOS not in vocabulary)
    contexts = {(BOS,), (BOS, sentences[0][0])} | {tuple(s[i:i + order - 1]) for s in sentences for i in range(len(s))}
    contexts |= {("zzz",) * (order - 1)}  # never seen: backs off to the unigrams
    for context in contexts:
        context = context[len(context) - order + 1:] if order > 1 else ()
        total = 0.0
        for token in predicted:
            p = 10 ** lm.log10_prob(context, token)
            assert p == pytest.approx(reference(context, token), rel=1e-5), (context, token)
            total += p
        assert total == pytest.approx(1.0, abs=1e-5)  # a distribution in every context


def test_a_character_model_scores_each_character():
    lm = train_witten_bell([transcript_tokens(t, "char") for t in ["help", "hello world", "a cat's hat"]], 4)
    assert lm.unit == "char" and SPACE in lm.vocabulary
    assert lm.score("help") > lm.score("hlep")
    assert lm.extend("hel", "p") > lm.extend("hel", "q")
    text = "hello world"
    incremental = sum(lm.extend(text[:i], c) for i, c in enumerate(text)) + lm.finish(text)
    assert incremental == pytest.approx(lm.score(text))


def test_witten_bell_needs_sentences():
    with pytest.raises(ValueError, match="no sentences"):
        train_witten_bell([], 3)
    with pytest.raises(ValueError, match="order must be at least 1"):
        train_witten_bell([["a"]], 0)
