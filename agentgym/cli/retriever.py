"""``agentgym serve-retriever`` and ``agentgym build-index``: Search-R1-compatible retrieval service.

``INDEX`` (or ``CORPUS``) is a saved index folder, a wiki-18 JSONL corpus (``{"id", "contents"}``,
indexed in memory at start-up), or ``builtin`` for the generated fictional world of
``agentgym/Search-v0``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["register"]


def _open_source(source: str, *, kind: str = "bm25", mmap: bool = False) -> Any:
    from agentgym.envs.search.retrieval import BM25Index, load_index

    if source == "builtin":
        from agentgym.envs.search.env import builtin_world

        passages = builtin_world().passages
    else:
        path = Path(source)
        if path.is_dir():
            return load_index(path, mmap=mmap)
        from agentgym.envs.search.data import load_wiki_corpus

        passages = load_wiki_corpus(path)
    if kind == "dense":
        from agentgym.envs.search.dense import DenseIndex

        return DenseIndex.build(passages)
    return BM25Index.build(passages)


def serve_retriever_cmd(
    index: Annotated[str, typer.Argument(help="Index folder, wiki-18 JSONL corpus, or 'builtin'.")],
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 8000,
    host: Annotated[str, typer.Option("--host", help="Interface to bind; 0.0.0.0 to serve other machines.")] = "127.0.0.1",
    topk: Annotated[int, typer.Option("--topk", help="Passages per query when a request omits topk.")] = 3,
    mmap: Annotated[bool, typer.Option("--mmap", help="Memory-map a saved index instead of loading it.")] = False,
    kind: Annotated[str, typer.Option("--kind", help="Index to build from a corpus: bm25 or dense.")] = "bm25",
    max_request_bytes: Annotated[int, typer.Option("--max-request-bytes", help="Largest request body (413 "
                                                   "beyond it).")] = 4 << 20,
    rate_limit: Annotated[float, typer.Option("--rate-limit", help="Requests per second per client address "
                                              "(429 beyond it); 0 = no limit.")] = 1000.0,
    burst: Annotated[int, typer.Option("--burst", help="Requests a client may send at once before "
                                       "--rate-limit applies.")] = 2000,
    max_connections: Annotated[int, typer.Option("--max-connections", help="Connections served at once "
                                                 "(503 beyond it).")] = 256,
) -> None:
    """Serve an index over HTTP with Search-R1's POST /retrieve API (and GET /health)."""
    import uvicorn
    from rich.console import Console

    from agentgym.envs.search.remote import create_app
    from agentgym.errors import AgentGymError

    console = Console(stderr=True)
    try:
        retriever = _open_source(index, kind=kind, mmap=mmap)
    except AgentGymError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(1) from e
    if max_request_bytes < 1024 or rate_limit < 0 or burst < 1 or max_connections < 1:
        console.print("[red]error:[/] need --max-request-bytes >= 1024, --rate-limit >= 0, --burst >= 1 and "
                      "--max-connections >= 1")
        raise typer.Exit(2)
    console.print(f"[green]serving[/] {index} on http://{host}:{port}/retrieve")
    app = create_app(retriever, default_topk=topk, max_request_bytes=max_request_bytes, rate_per_s=rate_limit,
                     burst=burst)
    uvicorn.run(app, host=host, port=port, log_level="warning", limit_concurrency=max_connections)


def build_index_cmd(
    corpus: Annotated[str, typer.Argument(help="wiki-18 JSONL corpus (.jsonl or .jsonl.gz), or 'builtin'.")],
    out: Annotated[Path, typer.Argument(help="Folder to write the index into.")],
    kind: Annotated[str, typer.Option("--kind", help="bm25 (default) or dense (needs agentgym[dense]).")] = "bm25",
) -> None:
    """Build a BM25 (or dense) index from a corpus and save it for serve-retriever or SearchEnv(index=...)."""
    import time

    from rich.console import Console

    from agentgym.errors import AgentGymError

    console = Console(stderr=True)
    if kind not in ("bm25", "dense"):
        console.print(f"[red]error:[/] --kind must be bm25 or dense, got {kind!r}")
        raise typer.Exit(2)
    t0 = time.perf_counter()
    try:
        index = _open_source(corpus, kind=kind)
        index.save(out)
    except AgentGymError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(1) from e
    console.print(f"indexed {len(index.docs)} passages in {time.perf_counter() - t0:.1f} s")
    typer.echo(str(out))


def register(app: typer.Typer) -> None:
    """Add ``serve-retriever`` and ``build-index`` to the main app."""
    app.command("serve-retriever")(serve_retriever_cmd)
    app.command("build-index")(build_index_cmd)
