"""An agent with nothing but the standard library (it runs in a bare container image): it reads the task
from ``AGENTGYM_TASK`` and talks to ``OPENAI_BASE_URL`` and the env's URL with ``urllib``."""

import json
import os
import sys
import urllib.request


def post(url: str, body: dict, key: str) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def main() -> int:
    task = json.loads(os.environ["AGENTGYM_TASK"])
    base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    messages = list(task["messages"])
    for _ in range(6):
        r = post(base + "/chat/completions", {"model": task["model"], "messages": messages, "tools": task["tools"]}, key)
        msg = r["choices"][0]["message"]
        messages.append(msg)
        action = {"tool_calls": msg["tool_calls"]} if msg.get("tool_calls") else {"content": msg.get("content") or ""}
        out = post(task["env_url"] + "/step", action, key)
        messages += out["messages"]
        if out["done"]:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
