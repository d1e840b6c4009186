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
(:func:`squad.engine.gguf.check_gguf`). What cannot be checked because the model file is
not on this machine is said in :attr:`Recipe.unchecked`.

At run time templates are rendered again, one field at a time (:meth:`Recipe.render_prompt`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from squad.chat.routing import duplicate_message, engine_key
from squad.chat.structured import OutputSchema
from squad.engine.facts import read_model_facts
from squad.engine.gguf import check_gguf
from squad.engine.registry import DEFAULT_MODEL, find_model, is_reference, known_models
from squad.errors import ModelError, UnknownModel
from squad.mcp import MCPServer
from squad.recipes.budgets import check_prompts, plan_budgets
from squad.recipes.check_agents import AgentChecks, tool_locs, unknown_agent
from squad.recipes.check_flow import FlowChecks, handling
from squad.recipes.load import Located, Path_, pydantic_error, read_yaml
from squad.recipes.model import EmptyMapWarning, EngineSettings, Recipe, RecipeWarning, Step
from squad.recipes.modelfile import model_file, n_ctx_train, text_counter
from squad.recipes.params import params_as_text, resolve_params, stand_in
from squad.recipes.spec import AgentFileSpec, RecipeSpec
from squad.runtime.agent import Agent
from squad.runtime.outcome import DEFAULT_HANDLING, Outcome
from squad.sched.planner import round_ctx

__all__ = ["load_recipe", "validate_recipe", "load_agents", "resolve_params",
           "stand_in"]  # the last two: squad.recipes.params

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


class _Loader(AgentChecks, FlowChecks):
    """Loads and checks one recipe or agents file (agents: :class:`AgentChecks`; flow and
    templates: :class:`FlowChecks`; model, budgets and engines here)."""

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
        params_as_text(located)
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
        self.tool_locs = tool_locs(raw_agents)
        if spec.main not in agents:
            raise unknown_agent(spec.main, agents, ("main",), located)
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
            self.check_instructions(agents[name], src, base)
        self.agents = agents
        self.main = spec.main
        self.ids: set[str] = set()
        self.with_schema: dict[str, tuple[str, OutputSchema]] = {}  # step id -> (kind, schema): steps.ID.value
        self.non_answers = handling(dict(DEFAULT_HANDLING), spec.non_answers)
        flow = tuple(self.build_steps(spec.flow, ("flow",), set()))
        if spec.output is not None:
            final = self.check_schema(spec.output.schema_, ("output", "schema"))
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
            text_counter=text_counter,
        )
        unset = {name for name, p in spec.params.items() if p.required and name not in given}
        for step, why in recipe.empty_maps(unset):  # known now: a map over no items is an empty answer
            self.warnings.append(_empty_map_warning(step, why, located, given))
        self.render_all(recipe, raw_agents, unset)
        check_prompts(recipe, unset=unset)
        plan_budgets(recipe, unset=unset)
        if model_file(model) is None:
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

    def _model(self, model: str | None, where: Path_ = ("model",)) -> str | None:
        if model is None or model == "default":
            return None
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
                raise self.located.error(f"model file not found: {path} (paths are relative to the recipe); fix the "
                                         "path or use a known model name", where)
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
