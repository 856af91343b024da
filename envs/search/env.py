"""``agentgym/Search-v0``: multi-turn retrieval QA (Search-R1 / ASearcher style).

The agent calls ``search(query, k)`` to read numbered passages and ``answer(answer)`` to finish; in
plain text, Search-R1's ``<search>query</search>`` and ``<answer>...</answer>`` tags work too. The
reward is exact match (default) or token F1 against the gold answers, with SQuAD normalisation.

By default the questions and corpus come from a generated fictional world (see
:mod:`agentgym.envs.search.world`) indexed with in-process BM25; the index is built once per
process and cached on disk under ``$AGENTGYM_CACHE/search/<hash>`` (default ``~/.cache/agentgym``).
Search-R1 question files, wiki-18 corpora, saved indexes and remote ``/retrieve`` servers plug in
through the constructor.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.envs.search.retrieval import BM25Index, Hit, Retriever
from agentgym.envs.search.text import best_score, exact_match
from agentgym.envs.search.world import RELATIONS, GeneratedWorld, extract, generate_world, parse_question

from agentgym.core import AgentEnv, StepResult
from agentgym.errors import ConfigurationError, RetrievalError
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec, ToolCall

__all__ = ["SearchEnv", "builtin_index", "builtin_world", "cache_root"]

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_WORLDS: dict[tuple[Any, ...], GeneratedWorld] = {}
_INDEXES: dict[str, Retriever] = {}

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_SEARCH_TAG = re.compile(r"<search>(.*?)</search>", re.DOTALL | re.IGNORECASE)


def cache_root() -> Path:
    """``$AGENTGYM_CACHE`` or ``$XDG_CACHE_HOME/agentgym`` or ``~/.cache/agentgym``."""
    env = os.environ.get("AGENTGYM_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "agentgym"


def builtin_world(seed: int = 0, scale: float = 1.0, n_train: int = 3000, n_test: int = 600) -> GeneratedWorld:
    """The generated world for these settings, built once per process."""
    key = (seed, scale, n_train, n_test)
    with _LOCK:
        if key not in _WORLDS:
            _WORLDS[key] = generate_world(seed, scale, n_train=n_train, n_test=n_test)
        return _WORLDS[key]


def builtin_index(world: GeneratedWorld, *, use_disk_cache: bool = True) -> Retriever:
    """The BM25 index of ``world``'s corpus: shared per process, cached on disk across processes."""
    key = world.fingerprint
    with _LOCK:
        if key in _INDEXES:
            return _INDEXES[key]
        folder = cache_root() / "search" / f"bm25-{key}"
        index: Retriever | None = None
        if use_disk_cache and (folder / "meta.json").exists():
            try:
                index = BM25Index.load(folder)
            except Exception:  # a corrupt cache is rebuilt, never fatal
                index = None
        if index is None:
            built = BM25Index.build(world.passages)
            if use_disk_cache:
                _save_atomically(built, folder)
            index = built
        _INDEXES[key] = index
        return index


def _save_atomically(index: BM25Index, folder: Path) -> None:
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        index.save(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # a read-only cache only costs a rebuild next time


class SearchEnv(AgentEnv):
    """Answer a question by searching a corpus; reward = EM or token F1 of the submitted answer.

    Args:
        retriever: ``"bm25"`` (default), ``"dense"``, an ``http(s)://`` URL of a ``/retrieve``
            server, or any object with ``search(query, k)`` and ``batch_search(queries, k)``.
        index: A saved index folder (``agentgym build-index``) to search instead of the built-in corpus.
        corpus: A wiki-18 JSONL corpus to index in-process instead of the built-in corpus.
        questions: A Search-R1 question file (JSONL/parquet; becomes split ``test``) or a mapping
            ``{split: path}``. Default: the generated questions.
        reward: ``"em"`` or ``"f1"``.
        topk: Default number of passages per search.
        max_k: Largest ``k`` the agent may ask for.
        max_query_chars: Longer queries get an error observation.
        world_seed, scale, n_train, n_test: Settings of the generated world.
        retrieval_timeout_s, retrieval_retries: Deadline and retries of a remote retriever.
        mmap: Memory-map a saved ``index``.
        **kwargs: ``parser``, ``format_penalty``, ``render_mode`` (see :class:`AgentEnv`).
    """

    family = "search"
    default_parser = "hermes"

    def __init__(
        self,
        *,
        retriever: str | Retriever = "bm25",
        index: str | None = None,
        corpus: str | None = None,
        questions: str | dict[str, str] | None = None,
        reward: str = "em",
        topk: int = 3,
        max_k: int = 10,
        max_query_chars: int = 1000,
        world_seed: int = 0,
        scale: float = 1.0,
        n_train: int = 3000,
        n_test: int = 600,
        retrieval_timeout_s: float = 10.0,
        retrieval_retries: int = 2,
        mmap: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if reward not in ("em", "f1"):
            raise ConfigurationError(f"reward must be 'em' or 'f1', got {reward!r}.")
        if not 1 <= topk <= max_k:
            raise ConfigurationError(f"need 1 <= topk <= max_k, got topk={topk}, max_k={max_k}.")
        self.reward_metric = reward
        self.topk, self.max_k, self.max_query_chars = int(topk), int(max_k), int(max_query_chars)
        self._retriever_spec = retriever
        self._index_path, self._corpus_path, self._mmap = index, corpus, mmap
        self._timeout_s, self._retries = retrieval_timeout_s, retrieval_retries
        self._retriever: Retriever | None = None if isinstance(retriever, str) else retriever
        self._owns_retriever = isinstance(retriever, str)  # close only what this env opened
        if isinstance(retriever, str) and retriever not in ("bm25", "dense") and not retriever.startswith(("http://", "https://")):
            raise ConfigurationError(f"retriever must be 'bm25', 'dense', an http(s) URL or a Retriever, got {retriever!r}.")
        self._world: GeneratedWorld | None = None
        self._world_args = (world_seed, scale, n_train, n_test)
        self._tasks: dict[str, list[TaskSpec]] = {}
        if questions is None:
            self._world = builtin_world(*self._world_args)
            for split, qs in self._world.questions.items():
                self._tasks[split] = [TaskSpec(q.qid, split, q.kind, {"question": q.question, "answers": q.answers,
                                                                      "form": q.form, "subjects": q.subjects})
                                      for q in qs]
        else:
            from agentgym.envs.search.data import load_questions

            files = {"test": questions} if isinstance(questions, (str, os.PathLike)) else dict(questions)
            self.load_log.env, self.load_log.source = "Search-v0", ", ".join(str(p) for p in files.values())
            for split, path in files.items():
                self._tasks[split] = [TaskSpec(f"{split}-{r['id']}", split, str(r["source"]),
                                               {"question": r["question"], "answers": list(r["answers"])})
                                      for r in load_questions(path, report=self.load_log)]
            self.load_log.loaded = sum(len(v) for v in self._tasks.values())
            self.load_log.warn(log)
            self.splits = tuple(self._tasks)  # type: ignore[misc]  # per-instance: the file's splits
            self.default_split = "train" if "train" in self._tasks else self.splits[0]  # type: ignore[misc]
        self._search_log: list[tuple[str, int, list[Hit]]] = []
        self._retrieval_failure: str | None = None
        self._expert: dict[str, Any] = {}

    # ------------------------------------------------------------------ retriever
    @property
    def retriever(self) -> Retriever:
        """The retrieval backend (built or loaded on first use)."""
        if self._retriever is None:
            self._retriever = self._make_retriever()
        return self._retriever

    def _make_retriever(self) -> Retriever:
        spec = self._retriever_spec
        if isinstance(spec, str) and spec.startswith(("http://", "https://")):
            from agentgym.envs.search.remote import RemoteRetriever

            return RemoteRetriever(spec, timeout_s=self._timeout_s, retries=self._retries)
        if self._index_path is not None:
            from agentgym.envs.search.retrieval import load_index

            return load_index(self._index_path, mmap=self._mmap)
        if self._corpus_path is not None:
            from agentgym.envs.search.data import load_wiki_corpus

            passages = load_wiki_corpus(self._corpus_path)
            if spec == "dense":
                from agentgym.envs.search.dense import DenseIndex

                return DenseIndex.build(passages)
            return BM25Index.build(passages)
        world = self._world or builtin_world(*self._world_args)
        if spec == "dense":
            from agentgym.envs.search.dense import DenseIndex

            return DenseIndex.build(world.passages)
        return builtin_index(world)

    def close(self) -> None:
        closer = getattr(self._retriever, "close", None)
        if self._owns_retriever and callable(closer) and not isinstance(self._retriever, BM25Index):
            closer()
        super().close()

    # ------------------------------------------------------------------ AgentEnv hooks
    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        return self._tasks.get(split, [])

    def system_prompt(self) -> str:
        return (
            "Answer the question. You cannot know the answer from memory: search the corpus first. "
            f"Call search with a query (and optionally k, 1-{self.max_k}) to read numbered passages; you may "
            "search several times. When you know the answer, call answer with a short answer (a name, place or "
            "year), or write <answer>...</answer>. " + self.parser.format_instructions(self.tools)
        )

    def reset_task(self, task: TaskSpec) -> list[Message]:
        self._search_log = []
        self._retrieval_failure = None
        self._expert = {}
        _ = self.retriever  # build or load before the first step so step latency stays flat
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": f"Question: {task.data['question']}"},
        ]

    # ------------------------------------------------------------------ tools
    @tool
    def search(self, query: str, k: int = 3) -> str:
        """Search the corpus and return the top passages, numbered, with their titles.

        Args:
            query: Keywords or a question.
            k: How many passages to return (1 to 10).

        Returns:
            "Doc 1 (Title: ...)" followed by its text, for each passage, best first.
        """
        query = query.strip()
        if not query:
            raise ValueError("the query is empty; search for some keywords")
        if len(query) > self.max_query_chars:
            raise ValueError(f"the query is {len(query)} characters long; at most {self.max_query_chars} are allowed")
        if "\x00" in query:
            raise ValueError("the query contains a NUL character")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        note = ""
        if k > self.max_k:
            note, k = f"(k was capped at {self.max_k})\n", self.max_k
        self.count("searches")
        try:
            hits = self.retriever.search(query, k)
        except RetrievalError as e:
            self.count("retrieval_errors")
            self._retrieval_failure = str(e)
            raise
        self._search_log.append((query, k, hits))
        if not hits:
            return f"{note}No passages match {query[:200]!r}. Try other keywords."
        return note + format_hits(hits)

    @tool
    def answer(self, answer: str) -> str:
        """Submit the final answer; this ends the episode.

        Args:
            answer: A short answer: a name, place, year or phrase.
        """
        return self._submit(answer)

    def _submit(self, answer: str) -> str:
        golds = self.task.data["answers"] if self.task else []
        score = best_score(answer, golds, self.reward_metric)
        success = any(exact_match(answer, g) for g in golds)
        self.finish(score, success)
        return f"Answer submitted: {answer.strip()[:200]!r}."

    # ------------------------------------------------------------------ dispatch
    def run_tool_calls(self, calls: list[ToolCall]) -> StepResult:
        result = super().run_tool_calls(calls)
        if self._retrieval_failure is not None:
            result.truncated = True
            result.info["retrieval_error"] = self._retrieval_failure
        return result

    def on_text(self, text: str) -> StepResult:
        a, s = _ANSWER_TAG.search(text), _SEARCH_TAG.search(text)
        if a and (not s or a.start() < s.start()):
            content = self._submit(a.group(1))
            return StepResult([{"role": "user", "content": content}])
        if s:
            res = self.run_tool_calls([{"id": "call_0", "name": "search", "arguments": {"query": s.group(1)}}])
            body = res.messages[0]["content"]
            res.messages = [{"role": "user", "content": f"<information>{body}</information>"}]
            return res
        return self.format_error("no tool call and no <answer>...</answer> found")

    def on_command(self, command: str) -> StepResult:
        return self.on_text(command)

    # ------------------------------------------------------------------ expert
    def expert_action(self) -> str | None:
        """A scripted searcher: it plans searches from the question, reads the passages it gets back
        and chains or compares the facts it finds. It never looks at the gold answer."""
        if self.task is None or self.done:
            return None
        ex = self._expert
        if not ex:
            ex.update(_plan(self.task.data["question"]), consumed=0)
        while ex["consumed"] < len(self._search_log):
            query, _, hits = self._search_log[ex["consumed"]]
            ex["consumed"] += 1
            _absorb(ex, query, hits)
        if ex["final"] is not None:
            return self._format_call("answer", {"answer": ex["final"]})
        query, k = ex["pending"]
        return self._format_call("search", {"query": query, "k": k})

    def _format_call(self, name: str, args: dict[str, Any]) -> str:
        if self.parser.name == "react":
            return f"Action: {name}[{next(iter(args.values()))}]"
        call = json.dumps({"name": name, "arguments": args})
        return call if self.parser.name == "json" else f"<tool_call>{call}</tool_call>"


def format_hits(hits: Sequence[Hit]) -> str:
    """Numbered passages with titles, best first."""
    return "\n\n".join(f"Doc {i} (Title: {h.title})\n{h.text}" for i, h in enumerate(hits, 1))


# ---------------------------------------------------------------------- expert internals
_MAX_ATTEMPTS = 3


def _plan(question: str) -> dict[str, Any]:
    parsed = parse_question(question)
    if parsed is None:  # not a generated question: search it verbatim, answer with the top title
        return {"chains": [], "generic": question, "final": None, "pending": (question[:500], 3), "values": []}
    form, subjects = parsed
    chains = [[s, list(form.hops)] for s in subjects]
    ex = {"chains": chains, "kind": form.kind, "subjects": subjects, "ci": 0, "hop": 0, "attempt": 0,
          "current": subjects[0], "values": [], "final": None, "generic": None}
    ex["pending"] = _query(ex)
    return ex


def _query(ex: dict[str, Any]) -> tuple[str, int]:
    rel = ex["chains"][ex["ci"]][1][ex["hop"]]
    kw = RELATIONS[rel][1]
    subject = ex["current"]
    if ex["attempt"] == 0:
        return (f"{subject} {kw}".strip(), 3)
    if ex["attempt"] == 1:
        return (subject, 10)
    return (f"{subject} {kw} {subject}".strip(), 10)


def _absorb(ex: dict[str, Any], query: str, hits: list[Hit]) -> None:
    if ex.get("final") is not None or query != ex["pending"][0]:
        return
    if ex["generic"] is not None:
        ex["final"] = hits[0].title if hits else "unknown"
        return
    chain = ex["chains"][ex["ci"]]
    value = extract(chain[1][ex["hop"]], ex["current"], hits)
    if value is None:
        ex["attempt"] += 1
        if ex["attempt"] >= _MAX_ATTEMPTS:
            ex["final"] = "unknown"
            return
        ex["pending"] = _query(ex)
        return
    ex["attempt"] = 0
    ex["hop"] += 1
    ex["current"] = value
    if ex["hop"] == len(chain[1]):
        ex["values"].append(value)
        ex["ci"] += 1
        ex["hop"] = 0
        if ex["ci"] == len(ex["chains"]):
            ex["final"] = _conclude(ex)
            return
        ex["current"] = ex["chains"][ex["ci"]][0]
    ex["pending"] = _query(ex)


def _conclude(ex: dict[str, Any]) -> str:
    if ex["kind"] != "comparison":
        return str(ex["values"][-1])
    try:
        years = [int(v) for v in ex["values"]]
    except ValueError:
        return "unknown"
    return str(ex["subjects"][years.index(min(years))])
