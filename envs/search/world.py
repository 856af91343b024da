"""A seeded fictional world, its Wikipedia-like corpus, and multi-hop questions over it.

Because every name and fact is invented, a model cannot answer from memory: it has to search.

The world holds countries, cities, people, organisations, works and events, with attributes
(years, occupations, types) and relations (born in, founded by, created by, headquartered in, took
place in, lies in). Each entity gets a short article of one to three passages, ~12.8k passages at
the default scale. Questions come in three kinds:

* ``1hop``: one fact about one entity ("In which city was Oralie Venmarth born?");
* ``bridge``: two facts chained through a bridge entity ("In which city was the creator of "X" born?");
* ``comparison``: the same fact about two entities, compared ("Who was born first, A or B?").

Splits are over disjoint entities: every person is drawn into ``train`` or ``test``, and the
organisations and works of a person go with them, so no test question names a train entity.
Places are shared (they are answers, never question subjects).

:data:`QUESTION_FORMS` (question templates and the hops that answer them) and :data:`RELATIONS`
(how each fact is written in a passage) are public: the scripted expert uses them to plan searches
and read passages; it never sees the gold answer.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from agentgym.envs.search.retrieval import Hit, Passage

__all__ = ["QUESTION_FORMS", "RELATIONS", "GeneratedWorld", "Question", "generate_world", "parse_question"]

GENERATOR_VERSION = 1

_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st",
           "t", "th", "tr", "v", "z", "sh", "qu", "y"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ai", "ea", "io", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "x"]

OCCUPATIONS = {  # occupation -> (work type, creator verb, release verb)
    "novelist": ("novel", "wrote", "published"),
    "film director": ("film", "directed", "released"),
    "composer": ("symphony", "composed", "premiered"),
    "painter": ("painting", "painted", "exhibited"),
    "poet": ("poetry collection", "wrote", "published"),
}
OTHER_OCCUPATIONS = ["physicist", "chemist", "architect", "merchant", "diplomat", "engineer", "botanist", "judge"]
ORG_TYPES = ["university", "trading company", "scientific society", "orchestra", "shipping company", "bank",
             "publishing house", "observatory"]
ORG_SUFFIX = {"university": "University", "trading company": "Trading Company", "scientific society": "Society",
              "orchestra": "Philharmonic", "shipping company": "Shipping Line", "bank": "Bank",
              "publishing house": "Press", "observatory": "Observatory"}
EVENT_KINDS = ["Treaty of", "Siege of", "Festival of", "Congress of", "Flood of", "Exhibition of"]
WORK_PATTERNS = ["The {A} of {B}", "{A}", "{A} and {B}", "Songs of {A}", "The Last {A}", "A {A} in {B}"]
_NOUNS = ["Lantern", "Harbour", "Orchard", "Mirror", "Citadel", "Garden", "Winter", "River", "Tower", "Voyage",
          "Silence", "Crown", "Meadow", "Compass", "Ember", "Tide", "Archive", "Bridge", "Falcon", "Hollow"]

# How each relation is written in a passage (group "v" is the value); the article title names the subject.
RELATIONS: dict[str, tuple[str, str]] = {  # relation -> (regex over passage text, search keywords)
    "birth_city": (r"was born in (?P<v>[^.]+?) in \d{3,4}\.", "born"),
    "birth_year": (r"was born in [^.]+? in (?P<v>\d{3,4})\.", "born"),
    "country": (r"is a city in (?P<v>[^.,]+)[.,]", "city country"),
    "founder": (r"was founded in \d{3,4} by (?P<v>[^.]+?)\.", "founded"),
    "founded_year": (r"was founded in (?P<v>\d{3,4}) by", "founded"),
    "hq_city": (r"headquartered in (?P<v>[^.,]+)[.,]", "headquartered"),
    "creator": (r"\bby (?P<v>[^,]+), first (?:published|released|premiered|exhibited) in", ""),
    "work_year": (r"first (?:published|released|premiered|exhibited) in (?P<v>\d{3,4})\.", ""),
    "event_city": (r"took place in (?P<v>[^.]+?) in \d{3,4}\.", "took place"),
    "event_year": (r"took place in [^.]+? in (?P<v>\d{3,4})\.", "took place"),
}
_REL_RE = {k: re.compile(v[0]) for k, v in RELATIONS.items()}


@dataclass(frozen=True)
class QuestionForm:
    """A question template, the regex that reads it back, and the hops that answer it."""

    key: str
    kind: str  # 1hop | bridge | comparison
    template: str
    regex: str
    hops: tuple[str, ...]  # relations, chained (bridge) or applied to each entity (comparison)


QUESTION_FORMS: list[QuestionForm] = [
    QuestionForm("birth_city", "1hop", "In which city was {p} born?", r"In which city was (?P<e>.+) born\?", ("birth_city",)),
    QuestionForm("birth_year", "1hop", "In what year was {p} born?", r"In what year was (?P<e>.+) born\?", ("birth_year",)),
    QuestionForm("founder", "1hop", "Who founded {o}?", r"Who founded (?P<e>.+)\?", ("founder",)),
    QuestionForm("founded_year", "1hop", "In what year was {o} founded?", r"In what year was (?P<e>.+) founded\?", ("founded_year",)),
    QuestionForm("hq_city", "1hop", "In which city is {o} headquartered?", r"In which city is (?P<e>.+) headquartered\?", ("hq_city",)),
    QuestionForm("creator", "1hop", 'Who {verb} the {wtype} "{w}"?', r'Who \w+ the [\w ]+ "(?P<e>.+)"\?', ("creator",)),
    QuestionForm("work_year", "1hop", 'In what year was the {wtype} "{w}" first {rverb}?', r'In what year was the [\w ]+ "(?P<e>.+)" first \w+\?', ("work_year",)),
    QuestionForm("event_city", "1hop", "In which city did the {e} take place?", r"In which city did the (?P<e>.+) take place\?", ("event_city",)),
    QuestionForm("event_year", "1hop", "In what year did the {e} take place?", r"In what year did the (?P<e>.+) take place\?", ("event_year",)),
    QuestionForm("creator_birth_city", "bridge", 'In which city was the creator of "{w}" born?', r'In which city was the creator of "(?P<e>.+)" born\?', ("creator", "birth_city")),
    QuestionForm("founder_birth_year", "bridge", "In what year was the founder of {o} born?", r"In what year was the founder of (?P<e>.+) born\?", ("founder", "birth_year")),
    QuestionForm("birth_country", "bridge", "In which country was {p} born?", r"In which country was (?P<e>.+) born\?", ("birth_city", "country")),
    QuestionForm("event_country", "bridge", "In which country did the {e} take place?", r"In which country did the (?P<e>.+) take place\?", ("event_city", "country")),
    QuestionForm("hq_country", "bridge", "In which country is {o} headquartered?", r"In which country is (?P<e>.+) headquartered\?", ("hq_city", "country")),
    QuestionForm("born_first", "comparison", "Who was born first, {p} or {p2}?", r"Who was born first, (?P<e>.+) or (?P<e2>.+)\?", ("birth_year",)),
    QuestionForm("founded_first", "comparison", "Which was founded earlier, {o} or {o2}?", r"Which was founded earlier, (?P<e>.+) or (?P<e2>.+)\?", ("founded_year",)),
    QuestionForm("work_first", "comparison", 'Which came out first, "{w}" or "{w2}"?', r'Which came out first, "(?P<e>.+)" or "(?P<e2>.+)"\?', ("work_year",)),
]
_FORMS = {f.key: f for f in QUESTION_FORMS}
# Bridge and comparison forms first: "the founder of X" must not be read as a 1-hop subject.
_FORM_RE = [(f, re.compile(f"^{f.regex}$"))
            for f in sorted(QUESTION_FORMS, key=lambda f: {"bridge": 0, "comparison": 1, "1hop": 2}[f.kind])]


def parse_question(question: str) -> tuple[QuestionForm, list[str]] | None:
    """Read a generated question back into (form, subject entities); ``None`` if no template fits."""
    q = question.strip()
    for form, rx in _FORM_RE:
        m = rx.match(q)
        if m:
            ents = [m.group("e")] + ([m.group("e2")] if "e2" in rx.groupindex else [])
            return form, ents
    return None


def extract(relation: str, subject: str, hits: list[Hit]) -> str | None:
    """The value of ``relation`` for ``subject`` from the passages titled ``subject``, if shown."""
    rx = _REL_RE[relation]
    for h in hits:
        if h.title != subject:
            continue
        m = rx.search(h.text)
        if m:
            return m.group("v").strip()
    return None


@dataclass
class Question:
    """One generated question."""

    qid: str
    split: str
    kind: str
    form: str
    question: str
    answers: list[str]
    subjects: list[str]


@dataclass
class GeneratedWorld:
    """The generated entities, their passages and the question pools per split."""

    seed: int
    entities: dict[str, list[dict[str, Any]]]
    passages: list[Passage]
    questions: dict[str, list[Question]] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """A hash of the corpus text: the cache key of its index."""
        h = hashlib.sha256()
        for p in self.passages:
            h.update(f"{p.doc_id}\x1f{p.title}\x1f{p.text}\x1e".encode())
        return h.hexdigest()[:16]


class _Namer:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, min_syl: int = 2, max_syl: int = 3) -> str:
        r = self.rng
        for _ in range(1000):
            n = int(r.integers(min_syl, max_syl + 1))
            w = "".join(_ONSETS[r.integers(len(_ONSETS))] + _VOWELS[r.integers(len(_VOWELS))] for _ in range(n))
            w = (w + _CODAS[r.integers(len(_CODAS))]).capitalize()
            if w not in self.used and len(w) >= 4:
                self.used.add(w)
                return w
        raise RuntimeError("name space exhausted")


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _pick(rng: np.random.Generator, seq: list[Any]) -> Any:
    return seq[int(rng.integers(len(seq)))]


def generate_world(seed: int = 0, scale: float = 1.0, *, n_train: int = 3000, n_test: int = 600,
                   test_fraction: float = 0.2) -> GeneratedWorld:
    """Generate the world, its corpus and its questions; the same arguments give the same output.

    Args:
        seed: World seed.
        scale: Multiplies the entity counts (1.0 gives ~12.8k passages).
        n_train: Questions in ``train`` (fewer if the world is too small).
        n_test: Questions in ``test``.
        test_fraction: Share of people (and so of their works and organisations) held out for ``test``.
    """
    rng = np.random.default_rng([seed, GENERATOR_VERSION])
    namer = _Namer(rng)
    n = {k: max(2, round(v * scale)) for k, v in
         {"country": 40, "city": 400, "person": 2400, "org": 600, "work": 1200, "event": 300}.items()}

    countries = [{"name": namer.word(2, 3) + _pick(rng, ["", "ia", "and", "mark", "esh"]), "kind": "country"}
                 for _ in range(n["country"])]
    for c in countries:
        c["name"] = c["name"].capitalize()
    cities = []
    for _ in range(n["city"]):
        cities.append({"name": namer.word(2, 3) + _pick(rng, ["", "", "ford", "holm", "port", "vale", "mere"]),
                       "kind": "city", "country": _pick(rng, countries)["name"],
                       "founded": int(rng.integers(900, 1600)), "population": int(rng.integers(8, 900)) * 1000,
                       "river": namer.word(2, 2)})
    for c in countries:
        c["capital"] = next((x["name"] for x in cities if x["country"] == c["name"]), cities[0]["name"])

    firsts = [namer.word(2, 2) for _ in range(160)]
    people: list[dict[str, Any]] = []
    full_names: set[str] = set()
    creative = list(OCCUPATIONS)
    while len(people) < n["person"]:
        name = f"{_pick(rng, firsts)} {namer.word(2, 3)}"
        if name in full_names:
            continue
        full_names.add(name)
        born = int(rng.integers(1600, 1950))
        occ = _pick(rng, creative) if rng.random() < 0.6 else _pick(rng, OTHER_OCCUPATIONS)
        people.append({
            "name": name, "kind": "person", "occupation": occ, "pronoun": _pick(rng, ["He", "She"]),
            "birth_year": born, "birth_city": _pick(rng, cities)["name"],
            "death_year": born + int(rng.integers(30, 95)), "death_city": _pick(rng, cities)["name"],
            "split": "test" if rng.random() < test_fraction else "train", "works": [], "orgs": [],
        })
    creators = [p for p in people if p["occupation"] in OCCUPATIONS]

    orgs = []
    for _ in range(n["org"]):
        founder = _pick(rng, people)
        otype = _pick(rng, ORG_TYPES)
        name = f"{namer.word(2, 3)} {ORG_SUFFIX[otype]}"
        year = founder["birth_year"] + int(rng.integers(20, 60))
        orgs.append({"name": name, "kind": "org", "type": otype, "founder": founder["name"], "founded_year": year,
                     "hq_city": _pick(rng, cities)["name"], "split": founder["split"]})
        founder["orgs"].append(name)

    works: list[dict[str, Any]] = []
    titles: set[str] = set()
    while len(works) < n["work"]:
        creator = _pick(rng, creators)
        pat = _pick(rng, WORK_PATTERNS)
        a = _pick(rng, _NOUNS) if rng.random() < 0.5 else namer.word(2, 3)
        title = pat.format(A=a, B=namer.word(2, 3))
        if title in titles:
            continue
        titles.add(title)
        wtype, verb, rverb = OCCUPATIONS[creator["occupation"]]
        year = creator["birth_year"] + int(rng.integers(20, 60))
        works.append({"name": title, "kind": "work", "type": wtype, "verb": verb, "rverb": rverb,
                      "creator": creator["name"], "year": year, "split": creator["split"]})
        creator["works"].append(title)

    events = []
    for _ in range(n["event"]):
        city = _pick(rng, cities)
        events.append({"name": f"{_pick(rng, EVENT_KINDS)} {namer.word(2, 3)}", "kind": "event",
                       "city": city["name"], "year": int(rng.integers(1500, 1990)),
                       "split": "test" if rng.random() < test_fraction else "train",
                       "participants": [_pick(rng, people)["name"] for _ in range(2)]})

    passages = _write_corpus(rng, countries, cities, people, orgs, works, events)
    world = GeneratedWorld(seed, {"country": countries, "city": cities, "person": people, "org": orgs,
                                  "work": works, "event": events}, passages)
    world.questions = {
        "train": _make_questions(rng, world, "train", n_train),
        "test": _make_questions(rng, world, "test", n_test),
    }
    return world


def _write_corpus(rng: np.random.Generator, countries: list[dict[str, Any]], cities: list[dict[str, Any]],
                  people: list[dict[str, Any]], orgs: list[dict[str, Any]], works: list[dict[str, Any]],
                  events: list[dict[str, Any]]) -> list[Passage]:
    out: list[Passage] = []

    def add(title: str, text: str) -> None:
        out.append(Passage(str(len(out)), title, text))

    for c in countries:
        add(c["name"], f"{c['name']} is a country whose capital is {c['capital']}. It is known for its "
                       f"{_pick(rng, ['mountain passes', 'salt marshes', 'river trade', 'old universities', 'vineyards'])} "
                       f"and its {_pick(rng, ['festivals', 'shipyards', 'libraries', 'stone bridges'])}.")
    for c in cities:
        add(c["name"], f"{c['name']} is a city in {c['country']}. It lies on the {c['river']} river and has a "
                       f"population of about {c['population']:,}.")
        add(c["name"], f"The settlement that became {c['name']} dates from {c['founded']}. Its "
                       f"{_pick(rng, ['market', 'cathedral', 'harbour', 'university quarter', 'old town'])} draws "
                       f"visitors from across {c['country']}.")
    for p in people:
        pr = p["pronoun"]
        poss = "his" if pr == "He" else "her"
        add(p["name"], f"{p['name']} ({p['birth_year']}–{p['death_year']}) was {_a(p['occupation'])}. "
                       f"{p['name']} was born in {p['birth_city']} in {p['birth_year']}.")
        known = (f"{pr} is best known for \"{p['works'][0]}\"." if p["works"]
                 else f"{pr} was a founding figure of {p['orgs'][0]}." if p["orgs"]
                 else f"{pr} spent most of {poss} career travelling between {p['birth_city']} and the coast.")
        add(p["name"], f"{pr} trained as {_a(p['occupation'])} and worked for many years with contemporaries in "
                       f"{p['death_city']}. {known}")
        add(p["name"], f"{pr} died in {p['death_city']} in {p['death_year']}. A "
                       f"{_pick(rng, ['street', 'square', 'prize', 'library', 'school'])} in {p['birth_city']} is "
                       f"named after {'him' if pr == 'He' else 'her'}.")
    for o in orgs:
        add(o["name"], f"{o['name']} is {_a(o['type'])} headquartered in {o['hq_city']}. It employs about "
                       f"{int(rng.integers(20, 4000))} people.")
        add(o["name"], f"{o['name']} was founded in {o['founded_year']} by {o['founder']}. In its early years "
                       f"it was based in a {_pick(rng, ['warehouse', 'townhouse', 'former chapel', 'rented hall'])}.")
        add(o["name"], f"Today {o['name']} is known for its {_pick(rng, ['archives', 'annual lectures', 'prizes', 'collections', 'apprenticeships'])}. "
                       f"Its {_pick(rng, ['board', 'council', 'members'])} meet in {_pick(rng, cities)['name']} each spring.")
    for w in works:
        add(w["name"], f"\"{w['name']}\" is {_a(w['type'])} by {w['creator']}, first {w['rverb']} in {w['year']}.")
        add(w["name"], f"Critics praised the {w['type']} for its {_pick(rng, ['structure', 'imagery', 'restraint', 'ambition', 'humour'])}; "
                       f"a {_pick(rng, ['revised', 'translated', 'restored', 'expanded'])} edition appeared "
                       f"{int(rng.integers(3, 40))} years later.")
    for e in events:
        add(e["name"], f"The {e['name']} took place in {e['city']} in {e['year']}.")
        add(e["name"], f"Among those present at the {e['name']} were {e['participants'][0]} and {e['participants'][1]}; "
                       f"accounts of it survive in {int(rng.integers(2, 30))} letters.")
    return out


def _make_questions(rng: np.random.Generator, world: GeneratedWorld, split: str, count: int) -> list[Question]:
    ents = world.entities
    city_country = {c["name"]: c["country"] for c in ents["city"]}
    person = {p["name"]: p for p in ents["person"]}
    P = [p for p in ents["person"] if p["split"] == split]
    Og = [o for o in ents["org"] if o["split"] == split]
    W = [w for w in ents["work"] if w["split"] == split]
    E = [e for e in ents["event"] if e["split"] == split]
    kinds = [("1hop", 0.45), ("bridge", 0.35), ("comparison", 0.20)]
    out: list[Question] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < count and attempts < count * 50:
        attempts += 1
        kind = kinds[int(rng.choice(3, p=[k[1] for k in kinds]))][0]
        forms = [f for f in QUESTION_FORMS if f.kind == kind]
        form = forms[int(rng.integers(len(forms)))]
        made = _instantiate(rng, form, P, Og, W, E, person, city_country)
        if made is None:
            continue
        text, answers, subjects = made
        if text in seen:
            continue
        seen.add(text)
        out.append(Question(f"search-{split}-{len(out):05d}", split, kind, form.key, text, answers, subjects))
    return out


def _instantiate(rng: np.random.Generator, form: QuestionForm, P: list[dict[str, Any]], Og: list[dict[str, Any]],
                 W: list[dict[str, Any]], E: list[dict[str, Any]], person: dict[str, dict[str, Any]],
                 city_country: dict[str, str]) -> tuple[str, list[str], list[str]] | None:
    k = form.key
    if k in ("birth_city", "birth_year", "birth_country") and P:
        p = _pick(rng, P)
        ans = {"birth_city": p["birth_city"], "birth_year": str(p["birth_year"]),
               "birth_country": city_country[p["birth_city"]]}[k]
        return form.template.format(p=p["name"]), [ans], [p["name"]]
    if k in ("founder", "founded_year", "hq_city", "founder_birth_year", "hq_country") and Og:
        o = _pick(rng, Og)
        ans = {"founder": o["founder"], "founded_year": str(o["founded_year"]), "hq_city": o["hq_city"],
               "founder_birth_year": str(person[o["founder"]]["birth_year"]), "hq_country": city_country[o["hq_city"]]}[k]
        return form.template.format(o=o["name"]), [ans], [o["name"]]
    if k in ("creator", "work_year", "creator_birth_city") and W:
        w = _pick(rng, W)
        ans = {"creator": w["creator"], "work_year": str(w["year"]),
               "creator_birth_city": person[w["creator"]]["birth_city"]}[k]
        return form.template.format(w=w["name"], verb=w["verb"], wtype=w["type"], rverb=w["rverb"]), [ans], [w["name"]]
    if k in ("event_city", "event_year", "event_country") and E:
        e = _pick(rng, E)
        ans = {"event_city": e["city"], "event_year": str(e["year"]), "event_country": city_country[e["city"]]}[k]
        return form.template.format(e=e["name"]), [ans], [e["name"]]
    if form.kind == "comparison":
        pool, attr, slot = {"born_first": (P, "birth_year", "p"), "founded_first": (Og, "founded_year", "o"),
                            "work_first": (W, "year", "w")}[k]
        if len(pool) < 2:
            return None
        a, b = _pick(rng, pool), _pick(rng, pool)
        if a is b or a[attr] == b[attr]:
            return None
        first = a if a[attr] < b[attr] else b
        text = form.template.format(**{slot: a["name"], f"{slot}2": b["name"]})
        return text, [first["name"]], [a["name"], b["name"]]
    return None


def world_summary(world: GeneratedWorld) -> dict[str, Any]:
    """Counts of entities, passages and questions (for README tables and the CLI)."""
    return {
        "passages": len(world.passages),
        "entities": {k: len(v) for k, v in world.entities.items()},
        "questions": {s: len(q) for s, q in world.questions.items()},
        "kinds": {s: {k: sum(1 for x in q if x.kind == k) for k in ("1hop", "bridge", "comparison")}
                  for s, q in world.questions.items()},
    }


def dumps_questions(questions: list[Question]) -> str:
    """Questions as Search-R1 style JSONL (``question``, ``golden_answers``)."""
    return "".join(json.dumps({"id": q.qid, "question": q.question, "golden_answers": q.answers,
                               "type": q.kind}) + "\n" for q in questions)
