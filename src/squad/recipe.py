"""YAML recipes: load one strictly, check it before any model call, turn it into a workload.

A recipe (format in ``docs/recipes.md``) declares a model, engine settings, typed
parameters, agents (with budgets, possibly from ``include:`` files), a main agent and a
flow of steps. :func:`load_recipe` gives a :class:`Recipe`; :func:`validate_recipe` runs
every check without parameter values or a model and returns warnings.

Checked before anything runs (each a :class:`~squad.errors.RecipeError` with file, line,
column, field path and a "did you mean" for near misses): YAML syntax and strictness
(:mod:`squad.recipe_load`), unknown keys and wrong types, unknown agents and sub-agents,
include cycles, step ids (unique; only earlier steps may be read), template syntax and
variables (``params.*``, ``steps.ID.output``/``outputs``, ``item``/``index`` in a map),
@mentions in prompts, parameter values, the model, and budgets above the model's
training context. A declared parameter no template uses is a warning.

Templates are rendered later, one field at a time (:meth:`Recipe.render_prompt`).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from squad.agent import NAME_PATTERN, Agent, check_squad
from squad.errors import RecipeError, UserError
from squad.flow import Call, Delegate, Map, Node, Parallel, Sequence
from squad.mention import parse_mentions
from squad.recipe_load import Located, Path_, field_path, pydantic_error, read_yaml
from squad.recipe_spec import AgentFileSpec, ParamSpec, RecipeSpec, StepSpec, coerce_param
from squad.templates import check_template, render_template, template_paths

if TYPE_CHECKING:
    from squad.session import EngineSpec

__all__ = ["Recipe", "Step", "EngineSettings", "RecipeWarning", "load_recipe", "validate_recipe", "load_agents"]

_STEP_FIELDS = ("output", "outputs")
_MAP_REF = re.compile(r"^(params\.[A-Za-z_][\w-]*|steps\.[A-Za-z][\w-]*(\.outputs?)?)$")


class RecipeWarning(UserWarning):
    """Something legal but probably unintended (an unused parameter). ``str()`` gives
    ``file:line:col: field: message`` like :class:`RecipeError`."""

    def __init__(self, problem: str, *, file: str | None = None, line: int | None = None,
                 column: int | None = None, field: str | None = None) -> None:
        self.problem, self.file, self.line, self.column, self.field = problem, file, line, column, field
        super().__init__(str(RecipeError(problem, file=file, line=line, column=column, field=field)))


@dataclass(frozen=True)
class EngineSettings:
    """Engine settings the recipe pins; None = auto (the planner decides)."""

    slots: int | None = None
    ctx: int | None = None
    cache_type: str | None = None


@dataclass(frozen=True)
class Step:
    """One checked flow step.

    - ``kind``: ``call`` (one prompt), ``parallel`` (``steps`` at once, ``policy``) or
      ``map`` (``prompt`` once per item of ``over``, ``concurrency`` at a time).
    - ``agent``: who receives ``prompt`` (the main agent when ``to_main``).
    - ``mentions``: sub-agents the prompt @mentions (as declared).
    - ``loc``: ``file``/``line``/``column``/``field`` of the prompt, for errors at run time.
    """

    id: str
    kind: Literal["call", "parallel", "map"]
    agent: str = ""
    to_main: bool = False
    prompt: str = ""
    mentions: tuple[str, ...] = ()
    steps: tuple["Step", ...] = ()
    policy: Literal["collect", "fail-fast"] = "collect"
    over: tuple[str, ...] = ()
    split: Literal["lines", "json"] = "lines"
    concurrency: int | None = None
    loc: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class Recipe:
    """A loaded, checked recipe.

    - ``model``: None (the built-in default), a registry name, or an absolute GGUF path.
    - ``engine``: pinned slots/ctx/cache type (None = auto).
    - ``params``: parameter values, typed (str, int, float, bool, list[str]; file = its text).
    - ``agents``: :class:`squad.agent.Agent` by name; ``main`` names the main agent.
    - ``output_schema``: JSON schema for the final output, or None.
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

    # --- workload ---------------------------------------------------------------------
    def engine_spec(self) -> "EngineSpec":
        """The engine this recipe asks for: its model and pins (slots, context, KV cache type
        for K and V). ``squad run`` and ``squad plan`` both start from it, then apply their
        command-line overrides with :meth:`EngineSpec.but`."""
        from squad.session import EngineSpec

        e = self.engine
        return EngineSpec(model=self.model, slots=e.slots, ctx=e.ctx, cache_type_k=e.cache_type or "f16")

    def workload(self) -> Node:
        """The flow as a :mod:`squad.flow` tree for the planner.

        A call is ``Call(agent, budget)``; a prompt that @mentions sub-agents (or an agent
        that may call sub-agents as tools) is ``Delegate(agent, Parallel(subs))``; a parallel
        block is ``Parallel``; a map is ``Map(item, count, limit=concurrency)`` with ``count``
        known when it maps over a list parameter.
        """
        return Sequence(tuple(self._node(step) for step in self.flow), label=self.name)

    def _node(self, step: Step) -> Node:
        if step.kind == "parallel":
            return Parallel(tuple(self._node(s) for s in step.steps), label=step.id)
        call = self._agent_node(step.agent, step.mentions)
        if step.kind == "map":
            count = None
            if step.over[0] == "params" and isinstance(self.params.get(step.over[1]), list):
                count = len(self.params[step.over[1]])
            return Map(call, count=count, limit=step.concurrency, label=step.id)
        return call

    def _agent_node(self, name: str, mentions: tuple[str, ...] = ()) -> Node:
        agent = self.agents[name]
        subs = mentions or (agent.agents if agent.sub_agent_tools else ())
        if not subs:
            return Call(name, agent.budget)
        nodes = tuple(self._agent_node(sub) for sub in subs)
        return Delegate(Call(name, agent.budget), nodes[0] if len(nodes) == 1 else Parallel(nodes))

    # --- run-time helpers -------------------------------------------------------------
    def render_prompt(self, step: Step, outputs: Mapping[str, Mapping[str, Any]], **extra: Any) -> str:
        """Render ``step.prompt`` with ``params``, ``steps`` (``outputs``) and ``extra``
        (``item``/``index`` in a map). Raises :class:`RecipeError` naming the field."""
        variables = {"params": self.params, "steps": outputs, **extra}
        return render_template(step.prompt, variables, where=step.loc.get("field", ""), loc=_file_loc(step.loc))

    def items(self, step: Step, outputs: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """The list a map step fans out over. Raises :class:`RecipeError` if a step output
        does not split into a list as declared."""
        if step.over[0] == "params":
            value = self.params[step.over[1]]
            return [str(v) for v in value] if isinstance(value, list) else _lines(str(value))
        out = outputs[step.over[1]]
        if len(step.over) > 2 and step.over[2] == "outputs":
            return [str(v) for v in out["outputs"]]
        text = str(out["output"])
        if step.split == "json":
            try:
                value = json.loads(_strip_fence(text))
            except json.JSONDecodeError as exc:
                raise RecipeError(f"step '{step.over[1]}' output is not a JSON list ({exc.msg}): {text[:200]!r}",
                                  **_file_loc(step.loc), field=f"{step.loc.get('field')}") from None
            if not isinstance(value, list):
                raise RecipeError(f"step '{step.over[1]}' output is JSON but not a list", **_file_loc(step.loc))
            return [v if isinstance(v, str) else json.dumps(v) for v in value]
        return _lines(text)

    def check_output(self, text: str) -> Any:
        """Parse ``text`` as JSON and validate it against ``output_schema``; returns the value.
        Raises :class:`UserError` saying what does not match."""
        import jsonschema

        try:
            value = json.loads(_strip_fence(text))
        except json.JSONDecodeError as exc:
            raise UserError(f"the final output is not JSON ({exc.msg}), but the recipe declares an output schema: {text[:200]!r}") from None
        try:
            jsonschema.validate(value, self.output_schema or {})
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
            raise UserError(f"the final output does not match the recipe's output schema at {where}: {exc.message}") from None
        return value

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
        if line:
            items.append(line)
    return items


def _strip_fence(text: str) -> str:
    m = re.search(r"```(?:json)?\s*\n(.*?)```", text, re.DOTALL)
    return m.group(1) if m else text.strip()


# --- loading -------------------------------------------------------------------------------


def load_recipe(path: Path | str, params: Mapping[str, str | list[str]] | None = None, *,
                require_params: bool = True) -> Recipe:
    """Load and check the recipe at ``path`` with parameter values ``params`` (strings as
    given with ``-p name=value``; a list parameter may also get a list of strings).

    ``require_params=False`` lets required parameters stay unset (for ``squad plan``
    without values); their value is then None. Raises :class:`RecipeError`.
    """
    return _Loader(Path(path)).load(params or {}, require_params=require_params)


def validate_recipe(path: Path | str) -> list[RecipeWarning]:
    """Run every check on the recipe at ``path`` without parameter values or a model call.
    Returns the warnings; raises :class:`RecipeError` for the first error."""
    return _Loader(Path(path)).load({}, require_params=False).warnings


def load_agents(path: Path | str) -> dict[str, Agent]:
    """Load a shared agents file (``agents:`` + optional ``include:``), as ``squad chat
    --agent-file`` does. Raises :class:`RecipeError`."""
    loader = _Loader(Path(path))
    located = read_yaml(loader.path, shown=str(path))
    try:
        AgentFileSpec.model_validate(located.data)
    except ValidationError as exc:
        raise pydantic_error(exc, located, (), AgentFileSpec) from None
    raw = loader.collect_agents(located, [loader.path.resolve()])
    return loader.build_agents(raw)


class _Loader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.warnings: list[RecipeWarning] = []
        self.used_params: set[str] = set()

    def load(self, given: Mapping[str, Any], *, require_params: bool) -> Recipe:
        located = read_yaml(self.path)
        self.located = located
        try:
            spec = RecipeSpec.model_validate(located.data)
        except ValidationError as exc:
            raise pydantic_error(exc, located, (), RecipeSpec) from None
        raw_agents = self.collect_agents(located, [self.path.resolve()])
        agents = self.build_agents(raw_agents)
        if spec.main not in agents:
            raise self._unknown_agent(spec.main, agents, ("main",))
        model = self._model(spec.model)
        self.specs = spec.params
        values = resolve_params(spec.params, given, located, self.path.parent, require=require_params)
        for name, (_, src, base) in raw_agents.items():
            self._check_instructions(agents[name], src, base)
        self.agents = agents
        self.main = spec.main
        self.ids: set[str] = set()
        flow = tuple(self._steps(spec.flow, ("flow",), set()))
        if spec.output is not None:
            self._check_schema(spec.output.schema_)
        for name in spec.params:
            if name not in self.used_params:
                line, column = located.where(("params", name), key=True)
                self.warnings.append(RecipeWarning(
                    f"parameter '{name}' is declared but no template uses it; use {{{{ params.{name} }}}} or remove it",
                    file=located.file, line=line, column=column, field=f"params.{name}"))
        self._check_budgets(model, agents, raw_agents)
        engine = EngineSettings(
            slots=None if spec.engine.slots == "auto" else spec.engine.slots,
            ctx=None if spec.engine.ctx == "auto" else spec.engine.ctx,
            cache_type=spec.engine.cache_type,
        )
        return Recipe(
            name=spec.name, description=spec.description, path=self.path, model=model, engine=engine,
            params=values, param_specs=dict(spec.params), agents=agents, main=spec.main, flow=flow,
            output_schema=spec.output.schema_ if spec.output else None, warnings=self.warnings,
        )

    # agents and includes ----------------------------------------------------------------
    def collect_agents(self, located: Located, stack: list[Path]) -> dict[str, tuple[dict, Located, Path_]]:
        """Agents defined in ``located`` and (first) its includes: name -> (data, file, path)."""
        found: dict[str, tuple[dict, Located, Path_]] = {}
        here = Path(located.file).parent
        for i, rel in enumerate(located.data.get("include") or []):
            target = (here / rel).resolve()
            if target in stack:
                chain = " -> ".join(p.name for p in [*stack[stack.index(target):], target])
                raise located.error(f"include cycle: {chain}; remove one of these includes", ("include", i))
            if not target.is_file():
                raise located.error(f"included file not found: {here / rel}", ("include", i))
            sub = read_yaml(target, shown=str(Path(located.file).parent / rel))
            try:
                AgentFileSpec.model_validate(sub.data)
            except ValidationError as exc:
                raise pydantic_error(exc, sub, (), AgentFileSpec) from None
            for name, entry in self.collect_agents(sub, [*stack, target]).items():
                self._add_agent(found, name, entry)
        for name, data in (located.data.get("agents") or {}).items():
            self._add_agent(found, name, (data, located, ("agents", name)))
        return found

    def _add_agent(self, found: dict, name: str, entry: tuple[dict, Located, Path_]) -> None:
        if name in found:
            first = found[name][1]
            line, _ = first.where(found[name][2], key=True)
            raise entry[1].error(f"agent '{name}' is already defined in {first.file}:{line}; rename one",
                                 entry[2], key=True)
        found[name] = entry

    def build_agents(self, raw: dict[str, tuple[dict, Located, Path_]]) -> dict[str, Agent]:
        agents: dict[str, Agent] = {}
        for name, (data, src, base) in raw.items():
            if not re.match(NAME_PATTERN, name):
                raise src.error(f"agent name '{name}' must be a letter then letters, digits, '-' or '_'", base, key=True)
            if "name" in data:
                raise src.error("an agent's name is its key; remove 'name:'", (*base, "name"), key=True)
            try:
                agents[name] = Agent(name=name, **data)
            except ValidationError as exc:
                raise pydantic_error(exc, src, base, Agent) from None
        for name, agent in agents.items():
            data, src, base = raw[name]
            for i, sub in enumerate(agent.agents):
                if sub not in agents:
                    raise self._unknown_agent(sub, agents, (*base, "agents", i), src)
        try:
            check_squad(list(agents.values()), tool_names=[t for a in agents.values() for t in a.tools])
        except UserError as exc:
            raise RecipeError(str(exc), file=str(self.path)) from None
        return agents

    def _unknown_agent(self, name: str, agents: Mapping[str, Agent], path: Path_,
                       src: Located | None = None) -> RecipeError:
        hint = difflib.get_close_matches(name, list(agents), n=1)
        did = f"; did you mean '{hint[0]}'?" if hint else f" (agents: {', '.join(sorted(agents)) or 'none'})"
        return (src or self.located).error(f"unknown agent '{name}'{did}", path)

    # model and budgets --------------------------------------------------------------------
    def _model(self, model: str | None) -> str | None:
        if model is None or model == "default":
            return None
        from squad.engine.registry import known_models

        if model in known_models():
            return model
        if model.endswith(".gguf") or "/" in model or "\\" in model:
            path = (self.path.parent / Path(model).expanduser()).resolve()
            if not path.is_file():
                raise self.located.error(f"model file not found: {path} (paths are relative to the recipe)", ("model",))
            return str(path)
        hint = difflib.get_close_matches(model, list(known_models()), n=1)
        did = f"; did you mean '{hint[0]}'?" if hint else ""
        raise self.located.error(
            f"unknown model '{model}'{did}; use default, a known name ({', '.join(known_models())}) "
            "or a path to a .gguf file", ("model",))

    def _check_budgets(self, model: str | None, agents: Mapping[str, Agent], raw: Mapping) -> None:
        n_ctx_train = _n_ctx_train(model)
        if n_ctx_train is None:
            return
        for name, agent in agents.items():
            if agent.budget > n_ctx_train:
                _, src, base = raw[name]
                raise src.error(
                    f"budget {agent.budget} tokens is above the model's training context "
                    f"({n_ctx_train}); lower it to at most {n_ctx_train}", (*base, "budget"))

    # templates ----------------------------------------------------------------------------
    def _check_instructions(self, agent: Agent, src: Located, base: Path_) -> None:
        path = (*base, "instructions")
        self._check_refs(agent.instructions, src, path, roots={"name", "description", "agents", "params"},
                         done=set(), in_map=False)

    def _check_refs(self, source: str, src: Located, path: Path_, *, roots: set[str], done: set[str],
                    in_map: bool) -> None:
        line, column = src.where(path)
        loc = {"file": src.file, "line": line, "column": column}
        where = field_path(path)
        check_template(source, where=where, loc=loc)  # syntax, unknown filters/tests: before any model call
        for ref in sorted(template_paths(source, where=where, loc=loc)):
            root = ref[0]
            if root not in roots:
                allowed = sorted(roots)
                hint = difflib.get_close_matches(root, allowed, n=1)
                did = f"; did you mean '{hint[0]}'?" if hint else ""
                if root in ("item", "index"):
                    did = "; item and index exist only in a map step"
                raise src.error(f"undefined template variable '{root}'{did} (templates here may use: {', '.join(allowed)})", path)
            if root == "params" and len(ref) > 1:
                self._param_ref(ref[1], src, path)
            if root == "steps" and len(ref) > 1:
                self._step_ref(ref, src, path, done)

    def _param_ref(self, name: str, src: Located, path: Path_) -> None:
        if name not in self.specs:
            hint = difflib.get_close_matches(name, list(self.specs), n=1)
            did = f"; did you mean '{hint[0]}'?" if hint else ""
            have = ", ".join(sorted(self.specs)) or "none"
            raise src.error(f"undefined template variable 'params.{name}'{did} (declared parameters: {have})", path)
        self.used_params.add(name)

    def _step_ref(self, ref: tuple[str, ...], src: Located, path: Path_, done: set[str]) -> None:
        sid = ref[1]
        if sid not in done:
            if sid in self.ids or sid in self._all_ids:
                raise src.error(f"step '{sid}' has not finished at this point; a step may use only steps before it", path)
            hint = difflib.get_close_matches(sid, list(self.ids) + list(self._all_ids), n=1)
            did = f"; did you mean '{hint[0]}'?" if hint else ""
            raise src.error(f"unknown step id '{sid}' in steps.{sid}{did}", path)
        if len(ref) > 2 and ref[2] not in _STEP_FIELDS:
            raise src.error(f"steps.{sid}.{ref[2]}: a step has output (text) and outputs (list)", path)

    # flow ---------------------------------------------------------------------------------
    def _steps(self, specs: list[StepSpec], path: Path_, done: set[str]) -> list[Step]:
        if path == ("flow",):
            self._all_ids = self._declared_ids(specs)
        steps = []
        for i, spec in enumerate(specs):
            step = self._step(spec, (*path, i), done)
            steps.append(step)
            done |= _ids_in(step)
        return steps

    def _declared_ids(self, specs: list[StepSpec]) -> set[str]:
        out: set[str] = set()
        for s in specs:
            if s.id:
                out.add(s.id)
            out |= self._declared_ids(s.parallel or [])
        return out

    def _step(self, spec: StepSpec, path: Path_, done: set[str]) -> Step:
        sid = spec.id or "step-" + "-".join(str(p + 1) for p in path if isinstance(p, int))
        if sid in self.ids:
            raise self.located.error(f"duplicate step id '{sid}'; step ids must be unique", (*path, "id"))
        self.ids.add(sid)
        if spec.kind == "parallel":
            children = []
            for j, child in enumerate(spec.parallel or []):
                children.append(self._step(child, (*path, "parallel", j), set(done)))
            return Step(id=sid, kind="parallel", steps=tuple(children), policy=spec.policy or "collect")
        agent = spec.agent or self.main
        if agent not in self.agents:
            raise self._unknown_agent(agent, self.agents, (*path, "agent"))
        over: tuple[str, ...] = ()
        if spec.kind == "map":
            over = self._map_ref(spec.map or "", (*path, "map"), done)
        prompt_path = (*path, "prompt")
        roots = {"params", "steps"} | ({"item", "index"} if spec.kind == "map" else set())
        self._check_refs(spec.prompt or "", self.located, prompt_path, roots=roots, done=done, in_map=spec.kind == "map")
        mentions = self._mentions(spec.prompt or "", agent, prompt_path)
        line, column = self.located.where(prompt_path)
        loc = {"file": self.located.file, "line": line, "column": column, "field": field_path(prompt_path)}
        return Step(id=sid, kind=spec.kind, agent=agent, to_main=spec.agent is None, prompt=spec.prompt or "",
                    mentions=mentions, over=over, split=spec.split or "lines",
                    concurrency=spec.concurrency, loc=loc)

    def _map_ref(self, ref: str, path: Path_, done: set[str]) -> tuple[str, ...]:
        text = ref.strip().removeprefix("{{").removesuffix("}}").strip()
        if not _MAP_REF.match(text):
            raise self.located.error(
                f"map: expected params.NAME, steps.ID.output or steps.ID.outputs, got {ref!r}", path)
        parts = tuple(text.split("."))
        if parts[0] == "params":
            self._param_ref(parts[1], self.located, path)
        else:
            self._step_ref(parts, self.located, path, done)
        return parts

    def _mentions(self, prompt: str, agent: str, path: Path_) -> tuple[str, ...]:
        """@mentions in a prompt. Only prompts to the main agent dispatch sub-agents (as
        ``Squad.run`` does): to its ``agents``, or to every other agent if it lists none."""
        parsed = parse_mentions(prompt, list(self.agents))
        for unknown in parsed.unknown:
            raise self.located.error(unknown.message(), path)
        if agent == self.main:
            lead = self.agents[agent]
            allowed = list(lead.agents) or [n for n in self.agents if n != agent]
        else:
            allowed = []
        for name in parsed.agents:
            if agent != self.main:
                raise self.located.error(
                    f"only prompts to the main agent ('{self.main}') can @mention sub-agents; drop "
                    f"agent: '{agent}' from this step or write '{name}' without @", path)
            if name not in allowed:
                raise self.located.error(
                    f"the main agent '{agent}' cannot @mention '{name}': add it to agents.{agent}.agents", path)
        return tuple(parsed.agents)

    def _check_schema(self, schema: dict[str, Any]) -> None:
        import jsonschema

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise self.located.error(f"output schema is not a valid JSON schema: {exc.message}", ("output", "schema")) from None


def resolve_params(specs: Mapping[str, ParamSpec], given: Mapping[str, Any], located: Located,
                   recipe_dir: Path, *, require: bool) -> dict[str, Any]:
    """Typed parameter values: given values (relative to the current directory for files),
    else defaults (relative to the recipe). Raises :class:`RecipeError` naming the parameter."""
    for name in given:
        if name not in specs:
            hint = difflib.get_close_matches(name, list(specs), n=1)
            did = f"; did you mean '{hint[0]}'?" if hint else ""
            have = ", ".join(sorted(specs)) or "none"
            raise RecipeError(f"unknown parameter '{name}'{did} (this recipe takes: {have})", file=located.file)
    values: dict[str, Any] = {}
    for name, spec in specs.items():
        if name in given:
            value = given[name]
            if isinstance(value, list) and spec.type != "list":
                if len(value) != 1:
                    raise RecipeError(f"parameter '{name}' was given {len(value)} times; it takes one value",
                                      file=located.file, field=f"params.{name}")
                value = value[0]
            try:
                values[name] = coerce_param(name, spec, value, Path.cwd())
            except ValueError as exc:
                raise RecipeError(f"{exc} (from -p {name}=...)", file=located.file, field=f"params.{name}") from None
        elif spec.default is not None:
            try:
                values[name] = coerce_param(name, spec, spec.default, recipe_dir)
            except ValueError as exc:
                raise located.error(f"default: {exc}", ("params", name, "default")) from None
        elif spec.required and require:
            line, column = located.where(("params", name), key=True)
            what = f" ({spec.description})" if spec.description else ""
            raise RecipeError(f"missing required parameter '{name}'{what}; pass -p {name}=VALUE",
                              file=located.file, line=line, column=column, field=f"params.{name}")
        else:
            values[name] = [] if spec.type == "list" else None
    return values


def _ids_in(step: Step) -> set[str]:
    out = {step.id}
    for s in step.steps:
        out |= _ids_in(s)
    return out


def _n_ctx_train(model: str | None) -> int | None:
    """The model's training context in tokens, when its file is on disk; else None."""
    try:
        from squad.engine.facts import read_model_facts
        from squad.engine.registry import DEFAULT_MODEL, known_models, model_path

        name = model or DEFAULT_MODEL
        path = model_path(name) if name in known_models() else Path(name)
        if not path.is_file():
            return None
        return read_model_facts(path).n_ctx_train
    except Exception:  # noqa: BLE001 - facts are a bonus check; the planner checks again
        return None
