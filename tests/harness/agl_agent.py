"""An agent written for Agent Lightning 1.0 (it runs in Agent Lightning's own Python >= 3.12 environment).

Its shape is Agent Lightning's: a class with ``run()``, the model behind ``AGL_OPENAI_BASE_URL``, the
reward posted as a ``reward`` event to ``AGL_EVENT_URL`` with Agent Lightning's own client and schemas,
the task in variables its ``env_map`` names (here the task's messages, tools and env URL). Nothing
here imports AgentGym.
"""

import json
import os

import httpx
import openai
from agentlightning.client import AgentLightningSyncClient
from agentlightning.schemas import EventCreate, RewardData


class LookupAgent:
    def run(self) -> None:
        key = os.environ["AGL_KEY"]
        messages = json.loads(os.environ["MESSAGES"])
        tools = json.loads(os.environ["TOOLS"])
        env_url = os.environ["ENV_URL"]
        reward = 0.0
        with openai.OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=key, max_retries=0) as client, \
                httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=300) as env:
            for _ in range(6):
                r = client.chat.completions.create(model="Qwen/Qwen2.5-1.5B-Instruct", messages=messages, tools=tools,
                                                   logprobs=True)
                msg = r.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                action = ({"tool_calls": [tc.model_dump() for tc in msg.tool_calls]} if msg.tool_calls
                          else {"content": msg.content or ""})
                out = env.post(env_url + "/step", json=action)
                out.raise_for_status()
                step = out.json()
                messages += step["messages"]
                reward += step["reward"]
                if step["done"]:
                    break
        event = EventCreate(event_type="reward",
                            data=RewardData(value=reward, source="agent", reason="env").model_dump(exclude_none=True))
        with AgentLightningSyncClient(key=key, timeout=60, max_retries=2) as api:
            api.post_with_retry(os.environ["AGL_EVENT_URL"], json=event.model_dump())
