"""The viewer's HTTP server on loopback: documents, and what keeps other web pages from reading them."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgym.errors import ConfigurationError
from agentgym.view import Site, ViewServer

pytestmark = pytest.mark.slow  # a real server on loopback


def get(srv: ViewServer, path: str, headers: dict[str, str] | None = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        hdrs = {"Host": f"127.0.0.1:{srv.port}", **(headers or {})}
        conn.request(method, path, headers=hdrs)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def site(runs: dict[str, Path]) -> Site:
    return Site([runs["before"], runs["after"], runs["train"]])


@pytest.fixture
def srv(site: Site) -> Iterator[ViewServer]:
    with ViewServer(site) as s:
        yield s


def test_page_bundle_and_documents(srv: ViewServer, site: Site) -> None:
    status, headers, body = get(srv, "/")
    assert status == 200 and b'content="server"' in body and b'src="app.js"' in body
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY" and headers["cross-origin-resource-policy"] == "same-origin"
    for name, ctype in (("app.js", "text/javascript"), ("app.css", "text/css")):
        status, headers, body = get(srv, "/" + name)
        assert status == 200 and headers["content-type"].startswith(ctype) and len(body) > 1000
    for path in ("index", "run/0", "run/0/chunk/0", "run/2", "run/2/gchunk/0", "compare/0,1", "compare/0%2C1"):
        status, headers, body = get(srv, f"/data/{path}.json", {"Sec-Fetch-Site": "same-origin"})
        assert status == 200, (path, body)
        assert headers["content-type"].startswith("application/json") and headers["cache-control"] == "no-store"
        assert json.loads(body) == json.loads(json.dumps(site.document(path.replace("%2C", ","))))


def test_unknown_documents_and_methods(srv: ViewServer) -> None:
    for path in ("/data/run/99.json", "/data/run/0/chunk/9.json", "/data/../../etc/passwd.json", "/data/index",
                 "/etc/passwd", "/app.py"):
        status, _, body = get(srv, path)
        assert status == 404, path
        assert "error" in json.loads(body)
    status, headers, _ = get(srv, "/data/index.json", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert get(srv, "/" + "a" * 3000)[0] == 414


def test_requests_from_other_sites_are_refused(srv: ViewServer) -> None:
    # a page on another site fetching, or including the data as a script or image
    assert get(srv, "/data/index.json", {"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert get(srv, "/data/index.json", {"Sec-Fetch-Site": "same-site"})[0] == 403  # another port on localhost
    assert get(srv, "/data/index.json", {"Origin": "http://evil.example"})[0] == 403
    assert get(srv, "/data/index.json", {"Origin": f"http://127.0.0.1:{srv.port + 1}"})[0] == 403
    # DNS rebinding: a name the attacker controls, resolving to 127.0.0.1
    status, _, body = get(srv, "/data/index.json", {"Host": f"evil.example:{srv.port}"})
    assert status == 403 and b"Host" in body
    assert get(srv, "/", {"Host": f"evil.example:{srv.port}"})[0] == 403
    assert get(srv, "/data/index.json", {"Host": f"localhost:{srv.port + 1}"})[0] == 403
    # the page itself, and the names of loopback
    assert get(srv, "/data/index.json", {"Origin": f"http://127.0.0.1:{srv.port}", "Sec-Fetch-Site": "same-origin"})[0] == 200
    assert get(srv, "/data/index.json", {"Host": f"localhost:{srv.port}"})[0] == 200
    assert get(srv, "/data/index.json", {"Sec-Fetch-Site": "none"})[0] == 200  # typed into the address bar


def test_token_rules(site: Site) -> None:
    with pytest.raises(ConfigurationError, match="without a token"):
        ViewServer(site, host="0.0.0.0")
    with pytest.raises(ConfigurationError, match="empty"):
        ViewServer(site, token="")
    with ViewServer(site, token="s3cret t") as srv:
        assert srv.url.endswith("/?token=s3cret%20t")
        assert get(srv, "/data/index.json")[0] == 401
        assert get(srv, "/")[0] == 401
        assert get(srv, "/data/index.json", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(srv, "/data/index.json", {"Cookie": f"agentgym_view_{srv.port}=wrong"})[0] == 401
        assert get(srv, "/data/index.json", {"Cookie": "agentgym_view=s3cret%20t"})[0] == 401  # another port's name
        assert get(srv, "/data/index.json", {"Authorization": "Bearer s3cret t"})[0] == 200
        status, headers, _ = get(srv, "/?token=s3cret%20t")
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"]
        assert cookie.startswith(f"agentgym_view_{srv.port}=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        jar = cookie.split(";")[0]
        assert get(srv, "/", {"Cookie": jar})[0] == 200
        assert get(srv, "/data/run/0.json", {"Cookie": "other=1; " + jar})[0] == 200
        assert get(srv, "/?token=wrong")[0] == 401


def test_non_loopback_bind_with_a_token_accepts_any_host_name(site: Site) -> None:
    with ViewServer(site, host="0.0.0.0", token="tok") as srv:
        assert not srv.loopback
        status = get(srv, "/data/index.json", {"Host": f"my-box.lan:{srv.port}", "Authorization": "Bearer tok"})[0]
        assert status == 200
        assert get(srv, "/data/index.json", {"Host": f"my-box.lan:{srv.port}"})[0] == 401


def test_port_in_use_is_a_clear_error(site: Site) -> None:
    with ViewServer(site) as srv, pytest.raises(ConfigurationError, match="cannot listen"):
        ViewServer(site, port=srv.port)


def test_odd_text_and_files_that_vanish(runs: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    from view_runs import trajectory

    run = tmp_path / "run"
    shutil.copytree(runs["before"], run)
    line = json.dumps(trajectory("lone", text="half a pair: \ud800 here").to_dict())  # escaped, as JSON allows
    with open(run / "episodes.jsonl", "a") as f:
        f.write(line + "\n")
    with ViewServer(Site([run])) as srv:
        status, _, body = get(srv, "/data/run/0/chunk/0.json")
        assert status == 200
        texts = [t["text"] for e in json.loads(body)["episodes"] for t in e["turns"]]
        assert "half a pair: \ud800 here" in texts
        (run / "episodes.jsonl").unlink()
        status, _, body = get(srv, "/data/run/0/chunk/0.json")
        assert status == 200 and json.loads(body)["episodes"] == []  # the index saw the file go
        assert json.loads(get(srv, "/data/run/0.json")[2])["episodes"] == 0
