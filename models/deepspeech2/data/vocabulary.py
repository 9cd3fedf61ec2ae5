"""The text the synthetic corpus speaks: digits, common words and short phrases.

Small on purpose: a tiny model should learn it in minutes on a CPU, yet it covers every
letter of the alphabet, so a learnt model spells rather than classifies.
"""

import numpy as np

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

WORDS = tuple("""
a about after again all also and any are back be because big black blue book box boy
but by call can car cat city come could cold day do dog door down each eat eight end
every eye far fast find first fish five for four friend from get girl give go good great
green hand have he help her here high home hot house how i in into is it jump just keep
kind know large last left let light like line little live long look make man many may me
more most mother move much my name near need new next night no not now of off old on one
only open or other our out over page part people place play put quick quiet read red
right room run said same say school sea see seven she should show side six small so some
sound stop story take talk tell ten than that the them then there these they thing think
this three time to today too tree try turn two under up us very walk want water way we
well went what when where which white who why will with word work world would write year
yes yellow you young your zoo zero jazz quiz don't it's i'm
""".split())

PHRASES = (
    "turn on the light", "turn off the light", "open the door", "close the window",
    "good morning", "good night", "thank you very much", "see you later", "how are you",
    "what time is it", "where is my book", "call my mother", "play some music",
    "stop the car", "go to school", "the dog can jump", "the cat is black",
    "it is very cold", "the sea is blue", "read me a story", "i like green tea",
    "we want to play", "come back home", "look at the sky", "the water is hot",
    "take the red box", "my friend is here", "walk in the park", "the quick brown fox",
    "he jumped over the fence", "she writes every day", "keep it quiet", "move to the left",
    "move to the right", "set an alarm", "the zoo is near", "a very lazy dog",
    "pack my box with jugs", "please wait here", "which way is north",
)


def sample_text(rng: np.random.Generator) -> str:
    """One transcript: a digit string, a few random words, or a stock phrase."""
    kind = rng.choice(3, p=(0.3, 0.4, 0.3))
    if kind == 0:
        return " ".join(rng.choice(DIGITS, size=rng.integers(2, 5)))
    if kind == 1:
        return " ".join(rng.choice(WORDS, size=rng.integers(2, 5)))
    return str(rng.choice(PHRASES))
