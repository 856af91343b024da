from __future__ import annotations

from agentgym.envs.search.world import QUESTION_FORMS, generate_world, parse_question, world_summary


def test_world_is_deterministic_and_large_enough() -> None:
    a, b = generate_world(0), generate_world(0)
    assert len(a.passages) >= 10_000
    assert a.fingerprint == b.fingerprint
    assert [q.question for q in a.questions["test"]] == [q.question for q in b.questions["test"]]
    assert generate_world(1).fingerprint != a.fingerprint


def test_question_kinds_and_counts() -> None:
    s = world_summary(generate_world(0))
    assert s["questions"] == {"train": 3000, "test": 600}
    for split in ("train", "test"):
        assert all(s["kinds"][split][k] > 50 for k in ("1hop", "bridge", "comparison"))


def test_splits_use_disjoint_entities() -> None:
    w = generate_world(0)
    subjects = {s: {e for q in w.questions[s] for e in q.subjects} for s in ("train", "test")}
    assert subjects["train"] and subjects["test"]
    assert not subjects["train"] & subjects["test"]
    # bridge entities (the founder/creator a test question goes through) are test entities too
    split_of = {e["name"]: e["split"] for kind in ("person", "org", "work") for e in w.entities[kind]}
    for q in w.questions["test"]:
        if q.form in ("creator_birth_city", "founder_birth_year"):
            ent = next(e for kind in ("org", "work") for e in w.entities[kind] if e["name"] == q.subjects[0])
            assert split_of[ent.get("founder") or ent["creator"]] == "test"


def test_every_question_parses_back_to_its_form() -> None:
    w = generate_world(0, scale=0.3, n_train=300, n_test=100)
    forms = set()
    for q in w.questions["train"] + w.questions["test"]:
        parsed = parse_question(q.question)
        assert parsed is not None, q.question
        assert parsed[0].key == q.form
        assert parsed[1] == q.subjects
        forms.add(q.form)
    assert forms == {f.key for f in QUESTION_FORMS}


def test_answers_appear_in_the_corpus() -> None:
    w = generate_world(0, scale=0.3, n_train=200, n_test=50)
    text = "\n".join(p.text for p in w.passages)
    for q in w.questions["test"]:
        assert q.answers[0] in text
