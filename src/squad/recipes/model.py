"""A checked recipe: its steps, the workload it gives the planner, its templates rendered.

:class:`Recipe` and :class:`Step` are what :func:`squad.recipes.load_recipe` returns after
every check (:mod:`squad.recipes.check`); nothing here reads a file. A recipe gives

- :meth:`Recipe.engine_spec`: the engine it asks for (model and pins); :meth:`Recipe.engine_specs`
  the engines, for a recipe with an ``engines:`` list;
- :meth:`Recipe.workload`: its flow as a :mod:`squad.sched.workload` tree for the planner;
- at run time (:mod:`squad.recipes.run`): prompts rendered one field at a time
  (:meth:`Recipe.render_prompt`), the items a map fans out over (:meth:`Recipe.items`) and the
  final output checked against the output schema (:meth:`Recipe.check_output`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from squad.chat.counting import MAX_BYTES_PER_TOKEN, estimate_tokens
from squad.chat.structured import OutputInvalid, OutputSchema, strip_fence
from squad.engine.spec import EngineSpec
from squad.errors import InvalidOutput, RecipeError
from squad.recipes.chunks import Count, split_chunks
from squad.recipes.spec import ParamSpec
from squad.runtime.agent import MAX_SUB_DEPTH, Agent
from squad.runtime.outcome import DEFAULT_HANDLING, Handling, Outcome
from squad.sched.policy import DEFAULT_QUEUE
from squad.sched.workload import Call, Delegate, Map, Node, Parallel, Sequence
from squad.templates import render_template
from squad.templates.text import is_blank

if TYPE_CHECKING:
    from squad.mcp import MCPServer

__all__ = ["Recipe", "Step", "EngineSettings", "RecipeWarning", "EmptyMapWarning", "StepBudget"]


class RecipeWarning(UserWarning):
    """Something legal but probably unintended (an unused parameter). ``str()`` gives
    ``file:line:col: field: message`` like :class:`RecipeError`."""

    def __init__(self, problem: str, *, file: str | None = None, line: int | None = None,
                 column: int | None = None, field: str | None = None) -> None:
        self.problem, self.file, self.line, self.column, self.field = problem, file, line, column, field
        super().__init__(str(RecipeError(problem, file=file, line=line, column=column, field=field)))


class EmptyMapWarning(RecipeWarning):
    """A map step whose input is known to be empty before the run (an empty list or text
    parameter, an empty file): the step will be an empty answer (:meth:`Recipe.no_items`)."""


@dataclass(frozen=True)
class EngineSettings:
    """Engine settings the recipe pins; None = auto (the planner decides). An item of
    ``engines:`` also has ``url``/``api_key`` (attach) or ``model``/``threads`` (launch)."""

    slots: int | None = None
    ctx: int | None = None
    cache_type: str | None = None
    gpu_layers: int | str | None = None
    url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    model: str | None = None
    threads: int | None = None
    queue: str | None = None


@dataclass(frozen=True)
class Step:
    """One checked flow step.

    - ``kind``: ``call`` (one prompt), ``parallel`` (``steps`` at once, ``policy``) or
      ``map`` (``prompt`` once per item of ``over``, ``concurrency`` at a time; with
      ``split: chunks`` the items are pieces of at most ``chunk_tokens`` tokens, ``overlap``
      tokens of lines repeated).
    - ``agent``: who receives ``prompt`` (the main agent when ``to_main``).
    - ``mentions``: sub-agents the prompt @mentions (as declared).
    - ``non_answers``: how each non-answer of this step flows on (:mod:`squad.runtime.outcome`),
      resolved from the step, its parallel block, the recipe and the defaults.
    - ``schema``: what each answer must be (the step's ``schema``, or the recipe's
      ``output.schema`` on a last call step), sent to the engine; None for free text.
    - ``loc``: ``file``/``line``/``column``/``field`` of the prompt, for errors at run time.
    """

    id: str
    kind: Literal["call", "parallel", "map"]
    agent: str = ""
    to_main: bool = False
    prompt: str = ""
    mentions: tuple[str, ...] = ()
    steps: tuple[Step, ...] = ()
    policy: Literal["collect", "fail-fast"] = "collect"
    over: tuple[str, ...] = ()
    split: Literal["lines", "json", "chunks"] = "lines"
    chunk_tokens: int | None = None
    overlap: int = 0
    concurrency: int | None = None
    non_answers: Mapping[Outcome, Handling] = field(default_factory=lambda: dict(DEFAULT_HANDLING))
    schema: OutputSchema | None = None
    shared: str = ""
    """Context put first in the agent's system message (the step's ``shared:``; "" for none)."""
    loc: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class StepBudget:
    """What one step needs of its agent's context, counted before the run
    (:func:`squad.recipes.budgets.plan_budgets`).

    - ``prompt``: tokens of the messages the agent is sent (system + user message, tool
      definitions, and for a main agent that @mentions sub-agents the sum of their
      ``max_tokens`` for the handed-back answers); ``estimated`` when an earlier step's output
      (or a hand-back) is in it, stood in for by that step's ``max_tokens`` worth of tokens.
    - ``budget``: what this step asks of the agent: prompt + ``max_tokens`` + its tool rounds + headroom,
      rounded up to 256 and capped by the training context; for a fixed budget, that budget.
    """

    step: str
    agent: str
    prompt: int
    max_tokens: int
    budget: int
    estimated: bool = False
    fixed: bool = False
    tool_rounds: int = 0
    """Tool rounds planned (the agent's ``max_tool_rounds`` when it has tools, else 0)."""
    tool_tokens: int = 0
    """Tokens planned for them: ``tool_rounds`` x (``max_tokens`` + results allowance)."""
    thinking_budget: int | None = None
    """The agent's ``thinking_budget``: the most of ``max_tokens`` one call may spend thinking
    (planned inside ``max_tokens``, never on top of it); None: not set."""


def _estimated(model: str | None) -> tuple[Count, bool]:
    """The :attr:`Recipe.text_counter` of a recipe built without one: the estimate."""
    return estimate_tokens, False


@dataclass
class Recipe:
    """A loaded, checked recipe.

    - ``model``: None (the built-in default), a registry name, or an absolute GGUF path.
    - ``engine``: pinned slots/ctx/cache type (None = auto).
    - ``params``: parameter values, typed (str, int, float, bool, list[str]; file = its text).
    - ``agents``: :class:`squad.runtime.agent.Agent` by name; ``main`` names the main agent.
    - ``output_schema``: JSON schema for the final output, or None.
    - ``mcp_servers``: its ``mcp:`` servers (:class:`squad.mcp.MCPServer`; never started by
      loading); ``tool_locs``: where each agent lists each MCP tool, for errors once they run.
    - ``planned``: agents whose ``auto`` budget :func:`~squad.recipes.budgets.plan_budgets` set
      (counted again when MCP tool schemas are known).
    - ``reads``: ``(path, why)`` of every file loading the recipe read besides itself
      (included agent files, the model, ``type: file`` parameters), for ``squad plan``.
    - ``context_limit``: the model's training context in tokens when its file is on disk.
    - ``unchecked``: what could not be checked before the run (the model file is not on
      this machine), said plainly by ``squad recipes validate``.
    """

    name: str
    description: str
    path: Path
    model: str | None
    engine: EngineSettings
    params: dict[str, Any]
    param_specs: dict[str, ParamSpec]
    agents: dict[str, Agent]
    main: str
    flow: tuple[Step, ...]
    output_schema: dict[str, Any] | None = None
    warnings: list[RecipeWarning] = field(default_factory=list)
    budgets: tuple[StepBudget, ...] = ()
    mcp_servers: tuple[MCPServer, ...] = ()
    tool_locs: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    planned: frozenset[str] = frozenset()
    reads: tuple[tuple[str, str], ...] = ()
    context_limit: int | None = None
    unchecked: list[RecipeWarning] = field(default_factory=list)
    engines: tuple[EngineSettings, ...] = ()
    """Its ``engines:`` list (several engines, :mod:`squad.chat.routing`), else empty."""
    shared_input: str = "prefix"
    """Its ``shared_input:`` (:mod:`squad.sched.share`)."""
    text_counter: Callable[[str | None], tuple[Count, bool]] = field(default=_estimated, repr=False, compare=False)
    """How :meth:`items` counts the tokens of a chunk: ``(count, exact)`` for the recipe's model,
    looked up each time (the model may be pulled after loading). Injected by the loader
    (:func:`squad.recipes.modelfile.text_counter`: the model's own tokenizer when its file is on
    disk); the default estimates (:func:`squad.chat.counting.estimate_tokens`)."""

    # --- workload ---------------------------------------------------------------------
    def engine_spec(self) -> EngineSpec:
        """The engine this recipe asks for: its model and pins (slots, context, KV cache type
        for K and V). ``squad run`` and ``squad plan`` both start from it, then apply their
        command-line overrides with :meth:`EngineSpec.but`."""
        e = self.engine
        return EngineSpec(model=self.model, slots=e.slots, ctx=e.ctx, cache_type_k=e.cache_type or "f16",
                          gpu_layers=e.gpu_layers, queue=e.queue or DEFAULT_QUEUE)

    def engine_specs(self) -> list[EngineSpec]:
        """The engines this recipe runs on: one spec per item of ``engines:`` (a launched one's
        model defaults to the recipe's ``model:``), else ``[engine_spec()]``."""
        if not self.engines:
            return [self.engine_spec()]
        queue = self.engine.queue or DEFAULT_QUEUE  # engine: queue applies to every engine unless an item sets its own
        return [EngineSpec(url=e.url, api_key=e.api_key, slots=e.slots, ctx=e.ctx, queue=e.queue or queue)
                if e.url is not None else
                EngineSpec(model=e.model or self.model, slots=e.slots, ctx=e.ctx, cache_type_k=e.cache_type or "f16",
                           gpu_layers=e.gpu_layers, threads=e.threads, queue=e.queue or queue)
                for e in self.engines]

    def workload(self) -> Node:
        """The flow as a :mod:`squad.sched.workload` tree for the planner.

        A call is ``Call(agent, budget)`` (None for a budget still auto: no prompt could be
        counted, the planner shares the context); a prompt that @mentions sub-agents (or an agent
        that may call sub-agents as tools) is ``Delegate(agent, Parallel(subs))``; a parallel
        block is ``Parallel``; a map is ``Map(item, count, limit=concurrency)`` with ``count``
        known when it maps over a list parameter.
        """
        return Sequence(tuple(self._node(step) for step in self.flow), label=self.name)

    def _node(self, step: Step) -> Node:
        if step.kind == "parallel":
            return Parallel(tuple(self._node(s) for s in step.steps), label=step.id)
        call = self._agent_node(step.agent, step.mentions, label=None if step.kind == "map" else step.id)
        if step.kind == "map":
            count = None
            if step.over[0] == "params" and isinstance(self.params.get(step.over[1]), list):
                count = len(self.params[step.over[1]])
            elif step.over[0] == "params" and step.split == "chunks" and self.params.get(step.over[1]) is not None:
                count = max(1, len(self.items(step, {})))
            return Map(call, count=count, limit=step.concurrency, label=step.id)
        return call

    def _agent_node(self, name: str, mentions: tuple[str, ...] = (), label: str | None = None,
                    depth: int | None = None) -> Node:
        """``name``'s call and the sub-agents it may reach: those it @mentions, else its
        sub-agent tools while the run's depth bound (``depth`` levels left) allows them;
        ``label``: the step id the plan shows."""
        agent = self.agents[name]
        if depth is None:  # the agent that starts the run sets its bound
            depth = agent.max_sub_depth or MAX_SUB_DEPTH
        subs = mentions or (agent.agents if agent.sub_agent_tools and depth > 0 else ())
        if not subs:
            return Call(name, agent.fixed_budget, label)
        nodes = tuple(self._agent_node(sub, depth=depth if mentions else depth - 1) for sub in subs)
        return Delegate(Call(name, agent.fixed_budget), nodes[0] if len(nodes) == 1 else Parallel(nodes), label)

    # --- run-time helpers -------------------------------------------------------------
    def render_prompt(self, step: Step, outputs: Mapping[str, Mapping[str, Any]], *, as_sent: bool = False,
                      capped: bool | None = None, **extra: Any) -> str:
        """Render ``step.prompt`` with ``params``, ``steps`` (``outputs``) and ``extra``
        (``item``/``index`` in a map, and ``chunks``, their number, with ``split: chunks``). Raises
        :class:`RecipeError` naming the field.

        ``as_sent=True`` (the run): what every ``{{ ... }}`` puts in is data, marked
        (:func:`squad.runtime.mention.as_data`), so only the recipe author's own text can @mention a
        sub-agent (field case F13); the mention parser hands out the text unmarked
        (:func:`squad.runtime.mention.unmark` for text sent without parsing). The rendered text is
        then capped by what the agent's context can hold (:meth:`max_chars`) before it goes
        anywhere (field case F18); ``capped`` (default: ``as_sent``) turns that cap on or off
        (budget planning measures the text itself)."""
        variables = {"params": self.params, "steps": outputs, **extra}
        cap, why = self.max_chars(step.agent) if (as_sent if capped is None else capped) else (None, "")
        text = render_template(step.prompt, variables, where=step.loc.get("field", ""), loc=_file_loc(step.loc),
                               data=as_sent, max_chars=cap, why=why)
        if cap is not None and len(text) > cap:  # a prompt without template syntax is not rendered
            raise RecipeError(f"the prompt is {len(text):,} characters, more than {cap:,}{why}; shorten it",
                              **_file_loc(step.loc), field=step.loc.get("field"))
        return text
    def render_shared(self, step: Step, outputs: Mapping[str, Mapping[str, Any]], **extra: Any) -> str | None:
        """Render ``step.shared`` (the context put first in its agent's system message) as
        :meth:`render_prompt` renders the prompt; None when the step has none."""
        if not step.shared:
            return None
        variables = {"params": self.params, "steps": outputs, **extra}
        return render_template(step.shared, variables, where=step.loc.get("field", "") + ".shared",
                               loc=_file_loc(step.loc))

    def max_chars(self, agent: str) -> tuple[int | None, str]:
        """``(characters, why)``: the most text one prompt to ``agent`` can be, at
        :data:`~squad.chat.counting.MAX_BYTES_PER_TOKEN` per token of its budget (or of the model's
        training context while its budget is auto); None when neither is known."""
        budget = self.agents[agent].fixed_budget
        tokens, whose = (budget, f"agent '{agent}' has a budget of {budget:,} tokens") if budget else \
            (self.context_limit,
             f"the model's training context is {self.context_limit:,} tokens") if self.context_limit \
            else (None, "")
        if tokens is None:
            return None, ""
        return MAX_BYTES_PER_TOKEN * tokens, f" ({whose}, at most {MAX_BYTES_PER_TOKEN} characters per token)"

    def items(self, step: Step, outputs: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """The list a map step fans out over. Raises :class:`RecipeError` if a step output
        does not split into a list as declared.

        With ``split: chunks`` the text is cut by :func:`squad.recipes.chunks.split_chunks`,
        counted by :attr:`text_counter` (the model's own tokenizer when its file is on disk, else
        estimated); empty text gives no items."""
        if step.split == "chunks":
            if step.over[0] == "params":
                value = self.params[step.over[1]]
                text = "" if value is None else str(value)
            else:
                text = str(outputs[step.over[1]]["output"])
            count, _ = self.text_counter(self.model)
            return split_chunks(text, step.chunk_tokens or 1, count, overlap=step.overlap)
        if step.over[0] == "params":
            value = self.params[step.over[1]]
            if isinstance(value, list):
                return [str(v) for v in value]
            text, what = "" if value is None else str(value), f"parameter '{step.over[1]}'"
        else:
            out = outputs[step.over[1]]
            if len(step.over) > 2 and step.over[2] == "outputs":
                return [str(v) for v in out["outputs"]]
            text, what = str(out["output"]), f"step '{step.over[1]}' output"
        if step.split == "json":
            try:
                value = json.loads(strip_fence(text))
            except json.JSONDecodeError as exc:
                raise RecipeError(f"{what} is not a JSON list ({exc.msg}): {text[:200]!r}",
                                  **_file_loc(step.loc), field=f"{step.loc.get('field')}") from None
            if not isinstance(value, list):
                raise RecipeError(f"{what} is JSON but not a list", **_file_loc(step.loc))
            items = [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in value]
            return [v for v in items if not is_blank(v)]  # a blank item would be a call on an empty prompt
        return _lines(text)

    def no_items(self, step: Step, outputs: Mapping[str, Mapping[str, Any]] | None = None) -> str | None:
        """Why map ``step`` has no items, when it is known to have none: its parameter's value
        (an empty list, empty or blank text, an empty file) or the output of an earlier step in
        ``outputs``; None when it has items or the input is not known yet (a required
        parameter without a value, a step that has not run)."""
        if step.kind != "map":
            return None
        source, name = step.over[0], step.over[1]
        value: Any = None
        if source == "params":
            value = self.params.get(name)
            if value is None:
                return None
        elif outputs is None or name not in outputs:
            return None
        if self.items(step, outputs or {}):
            return None
        if source == "steps":
            what = "outputs" if len(step.over) > 2 and step.over[2] == "outputs" else "output"
            return f"step '{name}''s {what} gives no items" + (f" (split: {step.split})" if step.split else "")
        spec = self.param_specs[name]
        if isinstance(value, list):
            return f"parameter '{name}' is an empty list"
        text = str(value)
        if spec.type == "file":
            return f"the file given for parameter '{name}' is empty" if not text else \
                f"the file given for parameter '{name}' holds only blank lines"
        return f"parameter '{name}' is empty text" if is_blank(text) else \
            f"parameter '{name}' gives no items (split: {step.split})"

    def empty_maps(self, unset: set[str] | frozenset[str] = frozenset()) -> list[tuple[Step, str]]:
        """``(step, why)`` of every map step whose items are known before the run to be none
        (:meth:`no_items` with the parameter values; ``unset``: required parameters without a
        value yet, not known); ``squad plan`` and validate warn of them."""
        return [(s, why) for s in self.steps_by_id().values()
                if not (s.over[:1] == ("params",) and s.over[1] in unset) and (why := self.no_items(s)) is not None]

    def check_output(self, text: str) -> Any:
        """Parse ``text`` as JSON and validate it against ``output_schema``; returns the value.
        Raises :class:`~squad.errors.InvalidOutput` saying what does not match, with ``text``
        as its raw answer (exit 1: the recipe and its input were fine)."""
        try:
            return OutputSchema.of(self.output_schema or {}).parse(text)
        except OutputInvalid as exc:
            raise InvalidOutput(f"the final output does not match the recipe's output schema ({exc}); "
                                "the raw output is kept", raw=text) from None

    def steps_by_id(self) -> dict[str, Step]:
        """Every step, nested ones included, by id."""
        found: dict[str, Step] = {}

        def walk(steps: tuple[Step, ...]) -> None:
            for s in steps:
                found[s.id] = s
                walk(s.steps)

        walk(self.flow)
        return found


def _file_loc(loc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: loc.get(k) for k in ("file", "line", "column")}


def _lines(text: str) -> list[str]:
    items = []
    for line in text.splitlines():
        line = re.sub(r"^\s*(?:[-*+]|\d+[.)])\s+", "", line).strip()
        if not is_blank(line):
            items.append(line)
    return items
