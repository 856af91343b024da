"""The routes of ``agentgym serve``, one FastAPI router per protocol, each built per served env.

* :mod:`~agentgym.serve.routes.openenv`: OpenEnv's HTTP API (``/health``, ``/metadata``,
  ``/schema``, ``/reset``, ``/step``, ``/state``);
* :mod:`~agentgym.serve.routes.extensions`: AgentGym's additions under ``/agentgym/`` (spec, tasks,
  sessions, expert);
* :mod:`~agentgym.serve.routes.mcp`: MCP over streamable HTTP (``POST``/``DELETE /mcp``): the MCP
  lifecycle for standard MCP clients, and OpenEnv's session methods;
* :mod:`~agentgym.serve.routes.websocket`: OpenEnv's ``/ws`` session protocol and MCP over ``WS /mcp``.

Every router talks to one :class:`~agentgym.serve.service.Service`.
"""
