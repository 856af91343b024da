from __future__ import annotations

import pytest
from agentgym.envs.search.text import best_score, exact_match, normalize_answer, token_f1, tokenize


def test_normalize_answer_squad_rules() -> None:
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("An apple, a pear") == "apple pear"


def test_exact_match_ignores_case_articles_punctuation() -> None:
    assert exact_match("the Paris.", "paris") == 1.0
    assert exact_match("Lyon", "Paris") == 0.0


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [("Charles Babbage", "Babbage", 2 * 0.5 * 1 / 1.5), ("babbage", "Babbage", 1.0), ("Ada", "Babbage", 0.0), ("", "", 1.0)],
)
def test_token_f1(pred: str, gold: str, expected: float) -> None:
    assert token_f1(pred, gold) == pytest.approx(expected)


def test_best_score_takes_max_over_golds() -> None:
    assert best_score("Babbage", ["Charles Babbage", "Babbage"], "em") == 1.0
    assert best_score("Charles", ["Charles Babbage"], "f1") == pytest.approx(2 / 3)
    assert best_score("x", [], "em") == 0.0


def test_tokenize_drops_stopwords_and_single_chars() -> None:
    assert tokenize("Who was the founder of X-Ray Society?") == ["founder", "ray", "society"]
