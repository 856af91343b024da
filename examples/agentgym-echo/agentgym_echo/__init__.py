"""An example plugin: this module stays light; env code is imported only when an env is made."""

import agentgym


def register() -> None:
    agentgym.register_env(
        "agentgym/EchoLoud-v0",
        "agentgym_echo.env:EchoEnv",
        family="example",
        max_episode_steps=5,
        kwargs={"loud": True},
        description="Repeat the phrase in capitals.",
    )
