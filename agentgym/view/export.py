"""``agentgym view RUN... --export DIR``: the viewer as static files that open from the file system.

The folder gets the page (``index.html`` in static mode, ``app.js``, ``app.css``) and every document of the
:class:`~agentgym.view.site.Site` as ``data/<path>.js``: one statement, ``AGV.put(path, document)``, loaded
with a ``<script>`` element when the page needs it (a browser refuses ``fetch`` from ``file://``). The
documents are the ones the server sends, so the export shows the same content; it can be zipped and shared.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from agentgym.errors import ConfigurationError
from agentgym.view.server import page_html, static_file
from agentgym.view.site import Site, encode

__all__ = ["MARKER", "export_site"]

MARKER = ".agentgym-view"


def export_site(site: Site, out: str | os.PathLike[str]) -> Path:
    """Write the static viewer of ``site`` to ``out``; returns the path of its ``index.html``.

    ``out`` must be missing, empty, or an earlier export (whose files are replaced).

    Raises:
        ConfigurationError: ``out`` is a file, or a non-empty folder that is not an earlier export.
    """
    dest = Path(out)
    if dest.exists() and not dest.is_dir():
        raise ConfigurationError(f"{dest} is a file; --export needs a folder.")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / MARKER).is_file():
        raise ConfigurationError(f"{dest} is not empty and not an earlier `agentgym view --export`; "
                                 "give a new folder.")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MARKER).write_text("written by agentgym view --export\n")
    if (dest / "data").is_dir():
        shutil.rmtree(dest / "data")
    for path in site.document_paths():
        target = dest / "data" / f"{path}.js"
        target.parent.mkdir(parents=True, exist_ok=True)
        body = b"AGV.put(" + json.dumps(path).encode() + b"," + encode(site.document(path)) + b");\n"
        target.write_bytes(body)
    (dest / "index.html").write_bytes(page_html("static"))
    for name in ("app.js", "app.css"):
        (dest / name).write_bytes(static_file(name))
    return dest / "index.html"
