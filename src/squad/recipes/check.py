"""Checking a recipe before any model call, and building the :class:`Recipe` it describes.

:func:`load_recipe` gives a checked :class:`~squad.recipes.model.Recipe`;
:func:`validate_recipe` runs every check without parameter values and returns warnings;
:func:`load_agents` reads a shared agents file.

Checked before anything runs (each a :class:`~squad.errors.RecipeError` with file, line,
column, field path and a "did you mean" for near misses): YAML syntax and strictness
(:mod:`squad.recipes.load`), unknown keys and wrong types (:mod:`squad.recipes.spec`),
unknown agents and sub-agents, include cycles, step ids (unique; only earlier steps may be
read), template syntax and variables (``params.*``, ``steps.ID.output``/``outputs``,
``item``/``index`` in a map), @mentions in prompts, parameter values, the model, and, when
the model file is on disk, budgets against it (:mod:`squad.recipes.budgets`: above the
training context, or too small for a fixed prompt). A declared parameter no template uses is
a warning.

Every template is also *rendered* before anything runs (field case F19), with the parameter
values (a required one without a value: a stand-in of its declared type, see
:func:`stand_in`) and every earlier step's output stood in for by a string, so what only
rendering finds (the sandbox refusing ``''.__class__``, ``{{ 1 / 0 }}``, a ``range()`` over
the sandbox's limit, ``{{ params.topic.nosuch }}``, a template that builds too much or takes
too long, :mod:`squad.templates.sandbox`) is a file:line error too. Types are strict: YAML ``true`` is
not the number 1, and a parameter of type string keeps a default such as ``1.10`` as written
(field case F21). A ``model:`` path must be a complete GGUF file
(:func:`squad.engine.facts.check_gguf`). What cannot be checked because the model file is
not on this machine is said in :attr:`Recipe.unchecked`.

At run time templates are rendered again, one field at a time (:meth:`Recipe.render_prompt`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from squad.runtime.agent import NAME_PATTERN, Agent, check_squad, check_tool_choice, find_cycle, sub_agent_names
from squad.errors import ModelError, RecipeError, UnknownModel, UserError
from squad.mcp import MCPServer, is_mcp_ref, resolve_cwd, split_ref, unknown_server
from squad.runtime.mention import parse_mentions
from squad.recipes.budgets import check_prompts, model_file, n_ctx_train, plan_budgets
from squad.recipes.load import Located, Path_, field_path, pydantic_error, read_yaml
from squad.recipes.model import EmptyMapWarning, EngineSettings, Recipe, RecipeWarning, Step
from squad.runtime.outcome import DEFAULT_HANDLING, Handling, Outcome
from squad.recipes.spec import AgentFileSpec, NonAnswersSpec, ParamSpec, RecipeSpec, StepSpec, coerce_param
from squad.templates import AnyValue, check_template, mark_tags, render_template, template_paths
from squad.chat.structured import OutputSchema

__all__ = ["load_recipe", "validate_recipe", "load_agents", "resolve_params", "stand_in"]

_STEP_FIELDS = ("output", "outputs")
_MAP_REF = re.compile(r"^(params\.[A-Za-z_][\w-]*|steps\.[A-Za-z][\w-]*(\.outputs?)?)$")


def load_recipe(path: Path | str, params: Mapping[str, str | list[str]] | None = None, *,
                require_params: bool = True, model: str | None = None, default_model: str | None = None,
                ctx: int | None = None) -> Recipe:
    """Load and check the recipe at ``path`` with parameter values ``params`` (strings as
    given with ``-p name=value``; a list parameter may also get a list of strings).

    ``require_params=False`` lets required parameters stay unset (for ``squad plan``
    without values); their value is then None. When the model file is on disk, budgets are
    checked against it, fixed prompts counted with these values
    (:func:`squad.recipes.budgets.check_prompts`). ``model`` (a known name or a ``.gguf`` path
    relative to the working directory, as ``--model`` gives it) replaces the recipe's model
    before anything is counted, so ``auto`` budgets follow the model that will really run.
    ``default_model`` is used when neither ``model`` nor the recipe names one (the command line
    passes the config file's model, :mod:`squad.config`). ``ctx``: a context given on the
    command line (``--ctx``), which replaces the recipe's ``engine.ctx`` in the checks of what
    can fit. Raises :class:`RecipeError`.
    """
    loader = _Loader(Path(path))
    loader.ctx_override = ctx
    return loader.load(params or {}, require_params=require_params, model=model, default_model=default_model)


def _override(model: str) -> str | None:
    """A ``--model`` given on the command line: None for the default model, a path made
    absolute (relative to the working directory), a name as given (the registry checks it)."""
    from squad.engine.registry import is_reference

    if model == "default":
        return None
    if is_reference(model):
        return model
    if model.endswith(".gguf") or "/" in model or "\\" in model:
        return str(Path(model).expanduser().resolve())
    return model


def validate_recipe(path: Path | str) -> list[RecipeWarning]:
    """Run every check on the recipe at ``path`` without parameter values (defaults only) or
    a model call. Returns the warnings; raises :class:`RecipeError` for the first error."""
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
        self.mcp_servers: tuple[MCPServer, ...] = ()
        self.warnings: list[RecipeWarning] = []
        self.used_params: set[str] = set()
        self.reads: list[tuple[str, str]] = []
        self.ctx_override: int | None = None

    def load(self, given: Mapping[str, Any], *, require_params: bool, model: str | None = None,
             default_model: str | None = None) -> Recipe:
        located = read_yaml(self.path)
        self.located = located
        _params_as_text(located)
        try:
            spec = RecipeSpec.model_validate(located.data)
        except ValidationError as exc:
            raise pydantic_error(exc, located, (), RecipeSpec) from None
        if spec.engines is not None and "engine" in located.data:
            raise located.error("give either engine: (one engine) or engines: (several), not both; move its "
                                "settings into each item of engines:", ("engines",), key=True)
        self._distinct_engines(spec.engines or [], located)
        self.mcp_servers = self.build_mcp(spec.mcp)
        raw_agents = self.collect_agents(located, [self.path.resolve()])
        agents = self.build_agents(raw_agents)
        self.tool_locs = _tool_locs(raw_agents)
        if spec.main not in agents:
            raise self._unknown_agent(spec.main, agents, ("main",))
        if model is not None:
            model = _override(model)
        elif spec.model is not None or default_model is None:
            model = self._model(spec.model)
        else:  # the config file's model: counted with, and run
            model = _override(default_model)
        self.specs = spec.params
        values = resolve_params(spec.params, given, located, self.path.parent, require=require_params,
                                reads=self.reads)
        for name, (_, src, base) in raw_agents.items():
            self._check_instructions(agents[name], src, base)
        self.agents = agents
        self.main = spec.main
        self.ids: set[str] = set()
        self.with_schema: dict[str, tuple[str, OutputSchema]] = {}  # step id -> (kind, schema): steps.ID.value
        self.non_answers = _handling(dict(DEFAULT_HANDLING), spec.non_answers)
        flow = tuple(self._steps(spec.flow, ("flow",), set()))
        if spec.output is not None:
            final = self._check_schema(spec.output.schema_, ("output", "schema"))
            if flow and flow[-1].kind == "call" and flow[-1].schema is None:  # sent with the last call
                flow = (*flow[:-1], dataclasses.replace(flow[-1], schema=final))
        for name in spec.params:
            if name not in self.used_params:
                line, column = located.where(("params", name), key=True)
                self.warnings.append(RecipeWarning(
                    f"parameter '{name}' is declared but no template uses it; use {{{{ params.{name} }}}} or remove it",
                    file=located.file, line=line, column=column, field=f"params.{name}"))
        self._check_budgets(model, agents, raw_agents)
        if self.ctx_override is None:  # a --ctx replaces the recipe's pin (the runtime checks that one)
            self._check_pinned_ctx(spec.engine.ctx, agents, raw_agents)
        engine = EngineSettings(
            slots=None if spec.engine.slots == "auto" else spec.engine.slots,
            ctx=None if spec.engine.ctx == "auto" else spec.engine.ctx,
            cache_type=spec.engine.cache_type,
            gpu_layers=spec.engine.gpu_layers,
            queue=spec.engine.queue,
        )
        engines = tuple(EngineSettings(
            slots=None if e.slots == "auto" else e.slots, ctx=None if e.ctx == "auto" else e.ctx,
            cache_type=e.cache_type, gpu_layers=e.gpu_layers, url=e.url, api_key=e.api_key, threads=e.threads,
            queue=e.queue,
            model=self._model(e.model, ("engines", i, "model")) if e.model is not None else None,
        ) for i, e in enumerate(spec.engines or ()))
        recipe = Recipe(
            name=spec.name, description=spec.description, path=self.path, model=model, engine=engine, engines=engines,
            params=values, param_specs=dict(spec.params), agents=agents, main=spec.main, flow=flow,
            output_schema=spec.output.schema_ if spec.output else None, warnings=self.warnings,
            mcp_servers=self.mcp_servers, tool_locs=self.tool_locs,
            reads=tuple(self.reads), context_limit=n_ctx_train(model), shared_input=spec.shared_input,
        )
        unset = {name for name, p in spec.params.items() if p.required and name not in given}
        for step, why in recipe.empty_maps(unset):  # known now: a map over no items is an empty answer
            self.warnings.append(_empty_map_warning(step, why, located, given))
        self._render_all(recipe, raw_agents, unset)
        check_prompts(recipe, unset=unset)
        plan_budgets(recipe, unset=unset)
        if model_file(model) is None:
            from squad.engine.registry import DEFAULT_MODEL

            what = f"model '{model}'" if model else f"the default model '{DEFAULT_MODEL}'"
            recipe.unchecked.append(RecipeWarning(
                f"{what} is not on this machine, so budgets were not checked against its training context and "
                f"prompts were not counted with its tokenizer; run `squad models pull {model or DEFAULT_MODEL}` "
                "and validate again",
                file=located.file, line=located.where(("model",))[0] if "model" in located.data else None,
                field="model"))
        return recipe

    @staticmethod
    def _distinct_engines(items: Sequence[Any], located: Located) -> None:
        """Two items of ``engines:`` at one URL are one engine counted twice: an error at the second."""
        from squad.chat.routing import duplicate_message, engine_key

        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            if item.url is None:
                continue
            key = engine_key(item.url)
            if key in seen:
                first = items[seen[key]].url
                line = located.where(("engines", seen[key]))[0]
                where = f" (first on line {line})" if line else ""
                raise located.error(duplicate_message(first, item.url, where=where), ("engines", i))
            seen[key] = i

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
            if target.is_dir():
                raise located.error(f"included path {here / rel} is a directory; give the path of an agents file "
                                    f"(.yaml) in it (paths are relative to {Path(located.file).name})",
                                    ("include", i))
            if not target.is_file():
                raise located.error(f"included file not found: {here / rel}; fix the path (relative to {Path(located.file).name})", ("include", i))
            sub = read_yaml(target, shown=str(Path(located.file).parent / rel))
            self.reads.append((str(target), f"agents included by {Path(located.file).name}"))
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
                raise src.error(f"agent name '{name}' must be a letter then letters, digits, '-' or '_'; rename it", base, key=True)
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
        servers = [s.name for s in self.mcp_servers]
        for name, agent in agents.items():
            data, src, base = raw[name]
            for i, tool in enumerate(agent.tools):
                if not is_mcp_ref(tool):
                    raise src.error(
                        f"agent '{name}' lists tool '{tool}', but a recipe cannot register function tools; remove it "
                        "(tools are registered in Python: Squad(..., tools=[...])), or name an MCP tool as "
                        "SERVER.TOOL", (*base, "tools", i))
                if split_ref(tool)[0] not in servers:
                    raise src.error(unknown_server(name, tool, servers), (*base, "tools", i))
        for name, agent in agents.items():
            self._distinct_tool_names(agent, raw[name])
        cycle = find_cycle(agents)
        if cycle:
            last, closing = cycle[-2], cycle[-1]
            _, src, base = raw[last]
            raise src.error(
                f"sub-agents form a cycle: {' -> '.join(cycle)}; an agent cannot (indirectly) call itself: "
                f"remove '{closing}' from agents.{last}.agents", (*base, "agents", agents[last].agents.index(closing)))
        for name, agent in agents.items():  # at the agent's tool_choice line
            try:
                check_tool_choice(agent, agents)
            except UserError as exc:
                _, src, base = raw[name]
                raise src.error(str(exc), (*base, "tool_choice")) from None
        try:
            check_squad(list(agents.values()), tool_names=[t for a in agents.values() for t in a.tools],
                        mcp_servers=servers)
        except UserError as exc:
            raise RecipeError(str(exc), file=str(self.path)) from None
        return agents

    @staticmethod
    def _distinct_tool_names(agent: Agent, entry: tuple[dict, Located, Path_]) -> None:
        """Two tools of ``agent`` the model would see under one name, found without starting a
        server: ``a.search`` and ``b.search``, ``x.get-item`` and ``y.get_item``, an MCP tool named
        like one of its ``ask_<name>`` sub-agent tools. An error at the second one's line
        (``SERVER.*`` is checked once the server lists its tools)."""
        from squad.mcp import model_name

        _, src, base = entry
        seen: dict[str, str] = {f"ask_{n}": f"its sub-agent tool for '{n}'" for n in agent.agents} \
            if agent.sub_agent_tools else {}
        for i, ref in enumerate(agent.tools):
            if not is_mcp_ref(ref) or split_ref(ref)[1] == "*":
                continue
            shown = model_name(split_ref(ref)[1])
            if shown in seen and seen[shown] != ref:
                raise src.error(f"agent '{agent.name}' gets two tools named '{shown}': {seen[shown]} and {ref} (the "
                                "model sees a tool by its own name, without the server); keep only one of them in its "
                                "tools", (*base, "tools", i))
            seen.setdefault(shown, ref)

    def build_mcp(self, raw: Mapping[str, dict[str, Any]]) -> tuple[MCPServer, ...]:
        """The ``mcp:`` servers, checked (a stdio server's ``cwd`` is relative to the recipe,
        which is also its default). Never started here."""
        servers = []
        for name, data in raw.items():
            base: Path_ = ("mcp", name)
            if not isinstance(data, dict):
                raise self.located.error("an MCP server is a mapping: command (+ args, env, cwd) or url", base)
            if "name" in data:
                raise self.located.error("an MCP server's name is its key; remove 'name:'", (*base, "name"), key=True)
            try:
                server = MCPServer(name=name, **data)
            except ValidationError as exc:
                raise pydantic_error(exc, self.located, base, MCPServer) from None
            servers.append(resolve_cwd(server, self.path.parent))
        return tuple(servers)

    def _unknown_agent(self, name: str, agents: Mapping[str, Agent], path: Path_,
                       src: Located | None = None) -> RecipeError:
        hint = difflib.get_close_matches(name, list(agents), n=1)
        did = f"; did you mean '{hint[0]}'?" if hint else f" (agents: {', '.join(sorted(agents)) or 'none'})"
        return (src or self.located).error(f"unknown agent '{name}'{did}", path)

    # model and budgets --------------------------------------------------------------------
    def _model(self, model: str | None, where: Path_ = ("model",)) -> str | None:
        if model is None or model == "default":
            return None
        from squad.engine.registry import find_model, is_reference, known_models

        if model in known_models():
            return model
        if is_reference(model):  # a model in a store: it must resolve (an hf: file not cached yet is pulled by run)
            try:
                self.reads.append((str(find_model(model, pull=False).path), "the model"))
            except UnknownModel as exc:
                raise self.located.error(str(exc), where) from None
            except ModelError:
                pass
            return model
        if model.endswith(".gguf") or "/" in model or "\\" in model:
            path = (self.path.parent / Path(model).expanduser()).resolve()
            if not path.exists():
                raise self.located.error(f"model file not found: {path} (paths are relative to the recipe); fix the path or use a known model name", where)
            from squad.engine.facts import check_gguf, read_model_facts

            try:
                check_gguf(path)
                read_model_facts(path)
            except ModelError as exc:
                raise self.located.error(str(exc), where) from None
            self.reads.append((str(path), "the model"))
            return str(path)
        hint = difflib.get_close_matches(model, list(known_models()), n=1)
        did = f"; did you mean '{hint[0]}'?" if hint else ""
        raise self.located.error(
            f"unknown model '{model}'{did}; use default, a known name ({', '.join(known_models())}), "
            "a path to a .gguf file or a store reference (hf:ORG/REPO[:QUANT], ollama:NAME[:TAG], "
            "lmstudio:PUBLISHER/MODEL)", where)

    def _check_pinned_ctx(self, ctx: Any, agents: Mapping[str, Agent], raw: Mapping) -> None:
        """An agent whose ``max_tokens`` alone fills the pinned ``engine.ctx`` has calls that can
        never fit (a prompt needs room too): an error at its ``max_tokens``."""
        if not isinstance(ctx, int) or isinstance(ctx, bool):
            return
        from squad.sched.planner import round_ctx

        room = round_ctx(ctx)
        for name, agent in agents.items():
            if agent.max_tokens is not None and agent.max_tokens >= room:
                _, src, base = raw[name]
                raise src.error(
                    f"max_tokens {agent.max_tokens:,} fills the whole context the recipe pins (engine.ctx {ctx:,}, "
                    f"{room:,} tokens after llama.cpp's rounding), so no call of agent '{name}' can ever fit with its "
                    f"prompt; lower max_tokens below {room:,} or raise engine.ctx", (*base, "max_tokens"))

    def _check_budgets(self, model: str | None, agents: Mapping[str, Agent], raw: Mapping) -> None:
        trained = n_ctx_train(model)
        if trained is None:
            return
        for name, agent in agents.items():
            if agent.fixed_budget is not None and agent.fixed_budget > trained:
                _, src, base = raw[name]
                raise src.error(
                    f"budget {agent.budget} tokens is above the model's training context "
                    f"({trained}); lower it to at most {trained}", (*base, "budget"))

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
                if root == "chunks":
                    did = "; chunks exists only in a map step with split: chunks"
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
            raise src.error(f"undefined template variable 'params.{name}'{did} (declared parameters: {have}); declare it under params: or fix the name", path)
        self.used_params.add(name)

    def _step_ref(self, ref: tuple[str, ...], src: Located, path: Path_, done: set[str]) -> None:
        sid = ref[1]
        if sid not in done:
            if sid in self.ids or sid in self._all_ids:
                raise src.error(f"step '{sid}' has not finished at this point; a step may use only steps before it: move this step after '{sid}'", path)
            hint = difflib.get_close_matches(sid, list(self.ids) + list(self._all_ids), n=1)
            did = f"; did you mean '{hint[0]}'?" if hint else ""
            raise src.error(f"unknown step id '{sid}' in steps.{sid}{did}", path)
        kind, schema = self.with_schema.get(sid, (None, None))
        if len(ref) > 2 and ref[2] not in _STEP_FIELDS and (schema is None or ref[2] != "value"):
            value = ", and value (its answer's parsed JSON)" if schema is not None else ""
            hint = ("; give that step a schema: to use its parsed JSON as value" if ref[2] in ("value", "values")
                    and schema is None else "")
            raise src.error(f"steps.{sid}.{ref[2]}: a step has output (text) and outputs (list){value}{hint}", path)
        if len(ref) > 3 and ref[2] == "value" and schema is not None:
            self._value_key(sid, kind, schema.schema, ref[3:], src, path)

    def _value_key(self, sid: str, kind: str, schema: Mapping[str, Any], keys: tuple[str, ...], src: Located,
                   path: Path_) -> None:
        """``steps.SID.value.KEY...`` must name properties the step's schema declares (when it
        lists ``properties`` and does not set ``additionalProperties``: a key it never names is a
        typo); a map's value is a list, indexed first."""
        for key in keys:
            if kind == "map":  # the list of items' values: an index first
                kind = "call"
                if key.isdigit():
                    continue
                raise src.error(f"steps.{sid}.value is a list (one value per item of the map): index it first, "
                                f"e.g. steps.{sid}.value[0].{key}", path)
            if schema.get("type") == "array":
                schema = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
                if key.isdigit():
                    continue
            props = schema.get("properties")
            if not isinstance(props, Mapping) or schema.get("additionalProperties", False) not in (False, None):
                return  # the schema does not say which keys there are
            if key not in props:
                have = ", ".join(props) or "none"
                raise src.error(f"steps.{sid}.value has no key '{key}': the step's schema declares {have}", path)
            schema = props[key] if isinstance(props[key], Mapping) else {}

    # flow ---------------------------------------------------------------------------------
    def _steps(self, specs: list[StepSpec], path: Path_, done: set[str]) -> list[Step]:
        if path == ("flow",):
            self._all_ids = self._declared_ids(specs)
        steps = []
        for i, spec in enumerate(specs):
            step = self._step(spec, (*path, i), done, self.non_answers)
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

    def _step(self, spec: StepSpec, path: Path_, done: set[str], inherited: Mapping[Outcome, Handling]) -> Step:
        sid = spec.id or "step-" + "-".join(str(p + 1) for p in path if isinstance(p, int))
        if sid in self.ids:
            raise self.located.error(f"duplicate step id '{sid}'; step ids must be unique: rename one", (*path, "id"))
        self.ids.add(sid)
        non_answers = _handling(inherited, spec.non_answers)
        if spec.kind == "parallel":
            children = []
            for j, child in enumerate(spec.parallel or []):
                children.append(self._step(child, (*path, "parallel", j), set(done), non_answers))
            return Step(id=sid, kind="parallel", steps=tuple(children), policy=spec.policy or "collect",
                        non_answers=non_answers)
        agent = spec.agent or self.main
        if agent not in self.agents:
            raise self._unknown_agent(agent, self.agents, (*path, "agent"))
        over: tuple[str, ...] = ()
        if spec.kind == "map":
            over = self._map_ref(spec.map or "", (*path, "map"), done)
            if over[0] == "params":
                self._map_param(over[1], spec.split, (*path, "map"))
            if spec.split == "chunks":
                self._chunk_source(over, (*path, "map"))
        prompt_path = (*path, "prompt")
        roots = {"params", "steps"} | ({"item", "index"} if spec.kind == "map" else set())
        roots |= {"chunks"} if spec.split == "chunks" else set()
        self._check_refs(spec.prompt or "", self.located, prompt_path, roots=roots, done=done, in_map=spec.kind == "map")
        mentions = self._mentions(spec.prompt or "", agent, prompt_path)
        line, column = self.located.where(prompt_path)
        loc = {"file": self.located.file, "line": line, "column": column, "field": field_path(prompt_path)}
        if spec.kind == "map":  # where the map: reference is, for a warning about its items
            map_line, map_column = self.located.where((*path, "map"))
            loc.update(map_line=map_line, map_column=map_column, map_field=field_path((*path, "map")))
        schema = None if spec.schema_ is None else self._check_schema(spec.schema_, (*path, "schema"))
        if schema is not None:
            self.with_schema[sid] = (spec.kind, schema)
        return Step(id=sid, kind=spec.kind, agent=agent, to_main=spec.agent is None, prompt=spec.prompt or "",
                    mentions=mentions, over=over, split=spec.split or "lines",
                    chunk_tokens=spec.chunk_tokens, overlap=spec.overlap or 0,
                    concurrency=spec.concurrency, non_answers=non_answers, schema=schema, loc=loc)

    def _map_param(self, name: str, split: str | None, path: Path_) -> None:
        """A map over a parameter needs items: a list parameter, or a text one with ``split``."""
        kind = self.specs[name].type
        if kind not in ("list", "string", "file"):
            raise self.located.error(
                f"map over parameter '{name}': a parameter of type {kind} has no items; use a list parameter "
                f"(type: list), or a text one with split: lines, json or chunks", path)
        if kind != "list" and split is None:
            raise self.located.error(
                f"map over parameter '{name}' (type {kind}) needs split: lines, json or chunks to cut it into items; "
                f"add one, or declare the parameter type: list", path)

    def _chunk_source(self, over: tuple[str, ...], path: Path_) -> None:
        """``split: chunks`` cuts a text: a string or file parameter, or ``steps.ID.output``."""
        if over[0] == "params" and self.specs[over[1]].type not in ("string", "file"):
            raise self.located.error(
                f"split: chunks cuts a text, but parameter '{over[1]}' is a {self.specs[over[1]].type}; "
                "use a string or file parameter, or drop split: chunks", path)
        if over[0] == "steps" and over[-1] == "outputs":
            raise self.located.error(
                f"split: chunks cuts a text, but steps.{over[1]}.outputs is a list; map over steps.{over[1]}.output", path)

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
        ``Squad.run`` does): to its ``agents``, or to every other agent if it lists none. Only
        the template's own text counts: what a ``{{ ... }}`` puts in is data at run time
        (:func:`squad.templates.mark_tags`)."""
        parsed = parse_mentions(mark_tags(prompt), list(self.agents))
        for unknown in parsed.unknown:
            raise self.located.error(unknown.message(), path)
        allowed = sub_agent_names(self.agents[agent], self.agents, self.main) if agent == self.main else []
        for name in parsed.agents:
            if agent != self.main:
                raise self.located.error(
                    f"only prompts to the main agent ('{self.main}') can @mention sub-agents; drop "
                    f"agent: '{agent}' from this step or write '{name}' without @", path)
            if name not in allowed:
                raise self.located.error(
                    f"the main agent '{agent}' cannot @mention '{name}': add it to agents.{agent}.agents", path)
        for problem in parsed.problems():  # idle mentions: nothing but the mention addressed to the agent
            raise self.located.error(problem, path)
        return tuple(parsed.agents)

    # rendering with stand-ins ---------------------------------------------------------------
    def _render_all(self, recipe: Recipe, raw: Mapping[str, tuple[dict, Located, Path_]], unset: set[str]) -> None:
        """Render every template once, before anything runs: instructions with the parameters,
        each step's prompt with the parameters, earlier steps' outputs stood in for by a string
        and a map's ``item`` by one. Raises the first :class:`RecipeError`, at its field."""
        params = {**recipe.params, **{n: stand_in(recipe.param_specs[n]) for n in unset}}
        for name, agent in recipe.agents.items():
            _, src, base = raw[name]
            path = (*base, "instructions")
            line, column = src.where(path)
            subs = [recipe.agents[n] for n in sub_agent_names(agent, recipe.agents, recipe.main)]
            variables = {"name": agent.name, "description": agent.description, "params": params,
                         "agents": [{"name": a.name, "description": a.description} for a in subs]}
            render_template(agent.instructions, variables, where=field_path(path),
                            loc={"file": src.file, "line": line, "column": column})
        standing = dataclasses.replace(recipe, params=params)
        outputs: dict[str, dict[str, Any]] = {}
        for step in recipe.flow:
            _render_step(standing, step, outputs)

    def _check_schema(self, schema: dict[str, Any], path: Path_) -> OutputSchema:
        """``schema`` (at ``path``) as an :class:`OutputSchema`; a :class:`RecipeError` there
        when it is not a valid JSON schema."""
        try:
            return OutputSchema.of(schema)
        except UserError as exc:
            raise self.located.error(str(exc), path) from None


def resolve_params(specs: Mapping[str, ParamSpec], given: Mapping[str, Any], located: Located,
                   recipe_dir: Path, *, require: bool, reads: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Typed parameter values: given values (relative to the current directory for files),
    else defaults (relative to the recipe). Raises :class:`RecipeError` naming the parameter.
    ``reads`` collects ``(path, why)`` of every file a ``type: file`` parameter read."""
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
            if spec.type == "file" and reads is not None:
                reads.append((str((Path.cwd() / str(value)).expanduser()), f"parameter '{name}' (type: file, from -p)"))
        elif spec.default is not None:
            try:
                values[name] = coerce_param(name, spec, spec.default, recipe_dir)
            except ValueError as exc:
                raise located.error(f"default: {exc}", ("params", name, "default")) from None
            if spec.type == "file" and reads is not None:
                reads.append((str((recipe_dir / Path(str(spec.default)).expanduser()).resolve()),
                               f"parameter '{name}' (type: file, its default)"))
        elif spec.required and require:
            line, column = located.where(("params", name), key=True)
            what = f" ({spec.description})" if spec.description else ""
            raise RecipeError(f"missing required parameter '{name}'{what}; pass -p {name}=VALUE",
                              file=located.file, line=line, column=column, field=f"params.{name}")
        else:
            values[name] = [] if spec.type == "list" else None
    return values


def _empty_map_warning(step: Step, why: str, located: Located, given: Mapping[str, Any]) -> EmptyMapWarning:
    """The warning for map ``step`` whose input is known to be empty (:meth:`Recipe.no_items`)."""
    name = step.over[1]
    origin = "as given" if name in given else "its default"
    handling = step.non_answers.get(Outcome.EMPTY, "mark")
    effect = {"mark": "passed on as [empty answer]", "fail": "a failure (the run fails there)",
              "accept": "passed on as empty text"}[handling]
    return EmptyMapWarning(
        f"map step '{step.id}' has no items to run ({why}, {origin}): it will be an empty answer, {effect} "
        f"(non_answers.empty: {handling}); pass items with -p {name}=..., or give the parameter a default "
        "with items", file=step.loc.get("file"), line=step.loc.get("map_line") or step.loc.get("line"),
        column=step.loc.get("map_column") or step.loc.get("column"), field=step.loc.get("map_field"))


def _tool_locs(raw: Mapping[str, tuple[dict, Located, Path_]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Where each agent lists each MCP tool: ``(agent, "server.tool")`` -> file, line, column, field."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for name, (data, src, base) in raw.items():
        for i, tool in enumerate(data.get("tools") or ()):
            if isinstance(tool, str) and is_mcp_ref(tool):
                path = (*base, "tools", i)
                line, column = src.where(path)
                out[(name, tool)] = {"file": src.file, "line": line, "column": column, "field": field_path(path)}
    return out


_STAND_INS: dict[str, Any] = {"string": "1", "file": "1", "int": 1, "number": 1.0, "bool": True, "list": ["1"]}


def stand_in(spec: ParamSpec) -> Any:
    """A value of ``spec``'s declared type for rendering a template without the real one:
    ``"1"`` for text (string, file), 1, 1.0, True, the first choice of an enum, ``["1"]``."""
    if spec.type == "enum":
        return (spec.choices or [""])[0]
    return _STAND_INS[spec.type]


_OUTPUT_STAND_IN = "1"
"""A step's output while validating: a string (``| int`` gives 1, never a division by zero)."""


def _render_step(recipe: Recipe, step: Step, outputs: dict[str, dict[str, Any]]) -> None:
    """Render ``step`` with ``outputs`` of the steps before it (a parallel block's steps do not
    see each other), then stand in for the outputs of it and its children."""
    if step.kind == "parallel":
        for child in step.steps:
            _render_step(recipe, child, dict(outputs))
    else:
        extra: dict[str, Any] = {}
        if step.kind == "map":
            extra = {"item": _OUTPUT_STAND_IN, "index": 0}
            if step.split == "chunks":
                extra["chunks"] = 1
        recipe.render_prompt(step, outputs, **extra)
    for sid in _ids_in(step):
        outputs[sid] = {"output": _OUTPUT_STAND_IN, "outputs": [_OUTPUT_STAND_IN], "error": None,
                        "value": AnyValue.many(_OUTPUT_STAND_IN) if step.kind == "map" else AnyValue(_OUTPUT_STAND_IN)}


_TEXT_TYPES = {"string", "enum", "file", "list"}


def _params_as_text(located: Located) -> None:
    """A text parameter's default and choices as written: ``default: 1.10`` of a string
    parameter is ``"1.10"``, not the float 1.1 YAML reads (field case F21)."""
    params = located.data.get("params")
    if not isinstance(params, dict):
        return
    for name, entry in params.items():
        if not isinstance(entry, dict) or entry.get("type", "string") not in _TEXT_TYPES:
            continue
        base = ("params", name)
        default = entry.get("default")
        if isinstance(default, list):
            entry["default"] = [located.as_text((*base, "default", i), v) for i, v in enumerate(default)]
        elif "default" in entry:
            entry["default"] = located.as_text((*base, "default"), default)
        if isinstance(entry.get("choices"), list):
            entry["choices"] = [located.as_text((*base, "choices", i), v) for i, v in enumerate(entry["choices"])]


def _ids_in(step: Step) -> set[str]:
    out = {step.id}
    for s in step.steps:
        out |= _ids_in(s)
    return out


def _handling(inherited: Mapping[Outcome, Handling], spec: NonAnswersSpec | None) -> dict[Outcome, Handling]:
    """``inherited`` with the outcomes ``spec`` (a ``non_answers:`` section) sets replaced."""
    out = dict(inherited)
    if spec is not None:
        out.update({Outcome(name): value for name, value in spec.model_dump().items() if value is not None})
    return out
