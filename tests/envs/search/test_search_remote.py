"""The /retrieve server and client, talking over real loopback HTTP (server tests are marked slow)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agentgym.envs.search.data import load_wiki_corpus
from agentgym.envs.search.env import SearchEnv
from agentgym.envs.search.remote import RemoteRetriever, RetrieverServer
from agentgym.envs.search.retrieval import BM25Index

from agentgym.errors import ConfigurationError, RetrievalError


def _call(name: str, **args: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


@pytest.fixture
def bm25(wiki_corpus: Path) -> BM25Index:
    return BM25Index.build(load_wiki_corpus(wiki_corpus))


@pytest.fixture
def server(bm25: BM25Index) -> Iterator[RetrieverServer]:
    with RetrieverServer(bm25) as srv:
        yield srv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_wire_format_matches_search_r1(server: RetrieverServer) -> None:
    body = {"queries": ["difference engine", "capital of France"], "topk": 2, "return_scores": True}
    r = httpx.post(server.url + "/retrieve", json=body, timeout=10)
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2 and len(result[0]) == 2
    top = result[0][0]
    assert set(top) == {"document", "score"} and top["score"] > 0
    assert top["document"]["contents"].split("\n")[0] == '"Charles Babbage"'
    no_scores = httpx.post(server.url + "/retrieve", json={**body, "return_scores": False}, timeout=10).json()
    assert no_scores["result"][1][0] == {"id": "3", "contents": '"Paris"\nParis is the capital and most populous city of France.'}
    assert httpx.get(server.url + "/health", timeout=10).json()["num_docs"] == 6


@pytest.mark.slow
def test_server_rejects_bad_requests(server: RetrieverServer) -> None:
    url = server.url + "/retrieve"
    assert httpx.post(url, json={"queries": "not a list"}, timeout=10).status_code == 422
    assert httpx.post(url, json={"queries": ["x"], "topk": 0}, timeout=10).status_code == 422
    assert httpx.post(url, json={"queries": ["x" * 10_000]}, timeout=10).status_code == 422
    assert httpx.post(url, json={"topk": 3}, timeout=10).status_code == 422
    # SkyRL's search client sends a single "query" string
    single = httpx.post(url, json={"query": "Rhone river", "topk": 1, "return_scores": True}, timeout=10).json()
    assert single["result"][0][0]["document"]["id"] == "5"
    default = httpx.post(url, json={"queries": ["France"]}, timeout=10).json()["result"][0]
    assert len(default) == 2  # default topk 3, but only two passages mention France


@pytest.mark.slow
def test_client_round_trip_equals_local(server: RetrieverServer, bm25: BM25Index) -> None:
    with RemoteRetriever(server.url) as client:
        for q in ["analytical engine", "river Lyon", "mathematician"]:
            remote, local = client.search(q, 3), bm25.search(q, 3)
            assert [(h.doc_id, h.title, h.text) for h in remote] == [(h.doc_id, h.title, h.text) for h in local]
            assert [h.score for h in remote] == pytest.approx([h.score for h in local])
        assert len(client.batch_search(["Paris", "Rhone", "Ada"], 1)) == 3
        with pytest.raises(RetrievalError, match="rejected"):
            client.search("x" * 10_000, 3)


@pytest.mark.slow
def test_env_over_http(server: RetrieverServer, wiki_corpus: Path, questions_jsonl: Path) -> None:
    env = SearchEnv(retriever=server.url, questions=str(questions_jsonl))
    env.reset(options={"task_id": "test-q1"})
    msgs, _, term, trunc, _ = env.step(_call("search", query="difference engine", k=2))
    assert "Doc 1 (Title: Charles Babbage)" in msgs[0]["content"] and not term and not trunc
    _, reward, term, _, _ = env.step(_call("answer", answer="Charles Babbage"))
    assert term and reward == 1.0
    env.close()


@pytest.mark.slow
def test_builtin_env_over_http_expert_still_solves() -> None:
    from agentgym.envs.search.env import builtin_index, builtin_world

    with RetrieverServer(builtin_index(builtin_world())) as srv:
        env = SearchEnv(retriever=srv.url)
        tasks = env.tasks("test")[:20]
        wins = 0
        for t in tasks:
            env.reset(options={"task_id": t.task_id})
            for _ in range(10):
                _, _, term, trunc, info = env.step(env.expert_action())
                if term or trunc:
                    break
            wins += bool(info.get("success"))
        env.close()
    assert wins >= 19


def test_dead_server_truncates_with_bounded_retries() -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens: connection refused
    env = SearchEnv(retriever=url, retrieval_timeout_s=1.0, retrieval_retries=2)
    env.reset(seed=0)
    t0 = time.perf_counter()
    msgs, reward, term, trunc, info = env.step(_call("search", query="born"))
    assert time.perf_counter() - t0 < 5
    assert trunc and not term and reward == 0.0
    assert "RetrievalError" in msgs[0]["content"] and "3 attempts" in msgs[0]["content"]
    assert "failed after 3 attempts" in info["retrieval_error"]
    assert info["metrics"]["retrieval_errors"] == 1
    env.close()


def test_hung_server_times_out() -> None:
    """A server that accepts connections but never answers costs (retries + 1) * timeout, no more."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)  # never accept(): the kernel completes the handshake, nobody replies
        client = RemoteRetriever(f"http://127.0.0.1:{s.getsockname()[1]}", timeout_s=0.3, retries=1, backoff_s=0.01)
        t0 = time.perf_counter()
        with pytest.raises(RetrievalError, match="2 attempts"):
            client.search("anything")
        assert time.perf_counter() - t0 < 3
        client.close()


@pytest.mark.slow
def test_malformed_response_is_a_retrieval_error(bm25: BM25Index) -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/retrieve")
    def broken() -> dict[str, object]:
        return {"result": "nope"}

    from agentgym.serve.runner import ServerThread

    with ServerThread(app, lifespan="off") as srv, pytest.raises(RetrievalError, match="malformed"):
        RemoteRetriever(srv.url).search("x")


def test_client_rejects_bad_url() -> None:
    with pytest.raises(ConfigurationError):
        RemoteRetriever("localhost:8000")


@pytest.mark.slow
def test_cli_build_index_and_serve_retriever(tmp_path: Path, wiki_corpus: Path) -> None:
    exe = [sys.executable, "-m", "agentgym"]
    out = subprocess.run([*exe, "build-index", str(wiki_corpus), str(tmp_path / "idx")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "idx" / "meta.json").exists()
    port = _free_port()
    proc = subprocess.Popen([*exe, "serve-retriever", str(tmp_path / "idx"), "--port", str(port), "--mmap"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
    try:
        client = RemoteRetriever(f"http://127.0.0.1:{port}", timeout_s=2, retries=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                hits = client.search("capital of France", 1)
                break
            except RetrievalError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "serve-retriever did not come up"
                time.sleep(0.2)
        assert hits[0].title == "Paris"
        client.close()
    finally:
        proc.terminate()
        proc.communicate(timeout=20)  # also closes the pipes


# ------------------------------------------------------------------------------ limits (issue 11)
@pytest.mark.slow
def test_server_caps_request_size_and_rate(bm25: BM25Index) -> None:
    with RetrieverServer(bm25, max_request_bytes=10_000, rate_per_s=5, burst=5) as srv:
        url = srv.url + "/retrieve"
        big = {"queries": ["x" * 100] * 200}
        r = httpx.post(url, json=big, timeout=10)
        assert r.status_code == 413, r.text

        def chunks() -> Iterator[bytes]:
            yield b'{"queries": ["'
            for _ in range(100):
                yield b"y" * 1000
            yield b'"]}'

        r = httpx.post(url, content=chunks(), headers={"content-type": "application/json"}, timeout=10)
        assert r.status_code == 413, "a chunked body with no Content-Length must be cut at the limit too"
        # send until the bucket runs dry (however slowly this machine sends), with a bound on the count
        codes: list[httpx.Response] = []
        with httpx.Client(timeout=10) as client:
            while len(codes) < 500 and not any(c.status_code == 429 for c in codes):
                codes.append(client.post(url, json={"queries": ["engine"]}))
        assert codes[0].status_code == 200
        limited = [c for c in codes if c.status_code == 429]
        assert limited and float(limited[0].headers["retry-after"]) > 0
        assert httpx.get(srv.url + "/health", timeout=10).status_code in (200, 429)


@pytest.mark.slow
def test_client_waits_out_rate_limits(bm25: BM25Index) -> None:
    with RetrieverServer(bm25, rate_per_s=20, burst=2) as srv:
        client = RemoteRetriever(srv.url, retries=5)
        try:
            for _ in range(10):
                assert client.search("difference engine", 1)
        finally:
            client.close()
