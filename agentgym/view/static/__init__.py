"""The run viewer's page: ``index.html``, ``app.js`` and ``app.css`` (data files, no Python)."""
