"""``agentgym view``: read eval and training runs in the browser.

A :class:`Site` indexes run folders (``episodes.jsonl``, ``summary.json``, ``metrics.jsonl``, ``groups.jsonl``,
``eval/<stage>/``, ``result.json``) and answers the page's documents; :class:`ViewServer` serves them on
loopback (a token and origin checks guard them), and :func:`export_site` writes them as static files that open
from the file system. The page is one small bundle shipped in the package (``static/``: vanilla JavaScript,
no build step, no CDN) and inserts everything from a transcript as text, never as HTML.
"""

from agentgym.view.export import export_site
from agentgym.view.runs import RunSource, discover_runs
from agentgym.view.server import ViewServer
from agentgym.view.site import Site

__all__ = ["RunSource", "Site", "ViewServer", "discover_runs", "export_site"]
