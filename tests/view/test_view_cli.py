"""``agentgym view``: the static export, and the command in a subprocess (export, serve, bad input)."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from view_runs import compare_links

from agentgym.errors import ConfigurationError
from agentgym.view import Site, export_site

pytestmark = pytest.mark.slow  # subprocesses and a server

AGENTGYM = [sys.executable, "-m", "agentgym"]


def read_export(out: Path) -> dict[str, Any]:
    """Every data file of an export, parsed back: ``AGV.put(path, doc);``."""
    docs: dict[str, Any] = {}
    for f in sorted((out / "data").rglob("*.js")):
        text = f.read_text(encoding="utf-8")
        assert text.startswith("AGV.put(") and text.endswith(");\n")
        path, end = json.JSONDecoder().raw_decode(text, len("AGV.put("))
        assert text[end] == ","
        body = text[end + 1:-3]
        assert f == out / "data" / f"{path}.js"
        docs[path] = json.loads(body)
    return docs


def test_export_writes_every_document_as_the_server_sends_it(runs: dict[str, Path], tmp_path: Path) -> None:
    train = tmp_path / "train"  # a training run with two middle stages: before, step-3, step-5, after
    shutil.copytree(runs["train"], train)
    shutil.copytree(runs["before"], train / "eval" / "step-000005")
    site = Site([runs["before"], runs["after"], train], chunk_size=5)
    index = export_site(site, tmp_path / "out")
    assert index == tmp_path / "out" / "index.html"
    html = index.read_text()
    assert 'content="static"' in html and 'content="server"' not in html
    assert (tmp_path / "out" / "app.js").stat().st_size > 1000 and (tmp_path / "out" / "app.css").is_file()
    docs = read_export(tmp_path / "out")
    assert sorted(docs) == sorted(site.document_paths())
    for path, doc in docs.items():
        assert doc == json.loads(json.dumps(site.document(path))), path
    # every comparison a page links to is in the export, the training page's "compare with before" of each stage too
    assert [p["stage"] for p in docs["run/2"]["heldout"]] == ["before", "step-000003", "step-000005", "after"]
    links = compare_links(docs)
    assert {"compare/3,4", "compare/3,5", "compare/3,6"} <= links
    assert sorted(links - set(docs)) == []
    # an earlier export is replaced; a folder holding anything else is refused
    export_site(Site([runs["before"]]), tmp_path / "out")
    assert sorted(read_export(tmp_path / "out")) == ["index", "run/0", "run/0/chunk/0"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("x")
    with pytest.raises(ConfigurationError, match="not empty"):
        export_site(site, tmp_path / "mine")
    with pytest.raises(ConfigurationError, match="is a file"):
        export_site(site, tmp_path / "mine" / "thesis.tex")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AGENTGYM_TOKEN", None)
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    return env


def test_cli_export_and_bad_input(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "site"
    p = subprocess.run([*AGENTGYM, "view", str(runs["before"]), str(runs["train"]), "--export", str(out)],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert p.returncode == 0, p.stderr
    assert "wrote" in p.stderr and (out / "index.html").is_file()
    assert len(json.loads((out / "data" / "index.js").read_text()[len('AGV.put("index",'):-3])["runs"]) == 5
    for args, msg in (([str(tmp_path / "nope")], "does not exist"),
                      ([str(runs["before"]), "--host", "0.0.0.0"], "without a token"),
                      ([str(runs["before"]), "--export", str(runs["before"])], "not empty")):
        p = subprocess.run([*AGENTGYM, "view", *args], capture_output=True, text=True, timeout=300, env=_env())
        assert p.returncode == 2 and msg in " ".join(p.stderr.split()), (args, p.stderr)


def test_cli_serves_until_interrupted(runs: dict[str, Path]) -> None:
    env = _env()
    env["AGENTGYM_TOKEN"] = "from-env"
    proc = subprocess.Popen([*AGENTGYM, "view", str(runs["before"]), "--port", "0"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr or []], daemon=True)
    reader.start()
    try:
        url = None
        while url is None:
            line = lines.get(timeout=120)  # the line that says where it serves
            m = re.search(r"at (http://127\.0\.0\.1:(\d+)/\?token=from-env)", line)
            if m:
                url, port = m.group(1), int(m.group(2))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/data/index.json", headers={"Authorization": "Bearer from-env"})
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["runs"][0]["kind"] == "eval"
        conn.close()
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # seen once in a loaded CI run: a second Ctrl-C, as a user would press
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)
        assert code == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=60)
        if proc.stderr is not None:
            proc.stderr.close()
