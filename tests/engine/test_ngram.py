"""Prompt-lookup drafting."""

from spectune.engine.drafting import prompt_lookup


def test_copies_what_followed_the_latest_match_of_the_longest_suffix() -> None:
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # suffix (5?) no; [2, 3] last seen at 6..7 followed by 7, 8
    assert prompt_lookup(tokens, 3, 1, 3) == [7, 8, 5]


def test_prefers_longer_ngrams() -> None:
    tokens = [4, 2, 3, 6, 1, 2, 3, 7, 1, 2, 3]
    assert prompt_lookup(tokens, 1, 1, 3) == [7]
    assert prompt_lookup([4, 2, 3, 6, 5, 2, 3], 1, 1, 3) == [6]


def test_no_match_and_short_sequences_give_no_draft() -> None:
    assert prompt_lookup([1, 2, 3, 4], 4, 1, 3) == []
    assert prompt_lookup([5], 4, 1, 3) == []
    assert prompt_lookup([5, 5], 4, 1, 3) == [5]


def test_draft_is_cut_at_the_end_of_the_sequence() -> None:
    assert prompt_lookup([1, 2, 1], 5, 1, 3) == [2, 1]
