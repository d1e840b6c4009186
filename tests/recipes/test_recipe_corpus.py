"""The malformed-recipe corpus (issue 11): every file in ``tests/recipes_bad`` that is a broken
recipe gives ONE clear error at its file:line, naming the field and how to fix it, exit 2 from
``squad recipes validate``, never a traceback, never a hang.

Kinds covered: YAML syntax and strictness, unknown keys, strict types (F21), parameters,
names and structure, map steps, agents/@mentions/cycles, template errors only rendering finds
(F19), resource bombs (F18), bad model files (F19), template internals that would be sent as
an object's repr (``{{ self }}``, ``loop``, a method not called, a generator), empty files,
keys with no value (``~``), duplicate MCP tool names, a ``max_tokens`` that fills a pinned
ctx, an include of a directory, a ``thinking_budget`` not below ``max_tokens`` or not a count.
Each file is checked with a time limit (pytest-timeout); the CLI run of the whole corpus goes
through a subprocess with a timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from squad.cli import main as squad_main
from squad.errors import RecipeError
from squad.recipes import validate_recipe

BAD = Path(__file__).resolve().parents[1] / "recipes_bad"

HELPERS = {
    "cycle_a.yaml": "included by include_cycle.yaml",
    "cycle_b.yaml": "included by include_cycle.yaml",
    "ok_bom.yaml": "a valid recipe with a BOM (test_recipe_errors.py)",
    "int_param.yaml": "valid; a bad -p value is the error (test_recipe_errors.py)",
    "missing_param.yaml": "valid at validate; missing at run (test_recipe_errors.py)",
    "budget_too_big.yaml": "needs the model file on disk (test_recipe_errors.py)",
    "unicode_names_ok.yaml": "valid: Korean, Japanese, Hindi and Persian names (joiners where Unicode "
                             "allows them), a parameter named items (test_unicode_names.py)",
}
"""Files in the folder that are not broken recipes on their own, and why."""

SYNTAX = {"bad_indent.yaml", "tab_indent.yaml", "unclosed_quote.yaml", "two_documents.yaml", "not_a_mapping.yaml",
          "yaml11.yaml", "empty_file.yaml", "only_separator.yaml"}
"""Errors about the file as a whole, before any field exists: no field to name."""

FIXES = ("did you mean", "add ", "remove", "write", "use ", "rename", "raise", "lower", "shorten", "fetch", "give ",
         "move", "drop", "keep", "declare", "fix ", "check ", "put ", "loop over less", "build less",
         "must be", "expected", "expects", "may use")
"""Words that tell the user what to do (a valid form counts: 'expected a whole number')."""

AT = {"include_cycle.yaml": "cycle_b.yaml"}
"""Errors reported in another file than the one validated: where the cycle closes."""

CORPUS = [
    ('agent_bad_name.yaml', 3, 'agents.2nd',
     "agent name '2nd' is not a name: '2' (U+0032 DIGIT TWO) cannot start a name"),
    ('agent_cycle.yaml', 4, 'agents.helper.agents[0]', 'sub-agents form a cycle: lead -> helper -> lead'),
    ('agent_cycle_three.yaml', 8, 'agents.c.agents[0]', 'sub-agents form a cycle: a -> b -> c -> a'),
    ('agent_lists_itself.yaml', 3, 'agents.a', "agent 'a' lists itself in agents"),
    ('agent_name_key.yaml', 4, 'agents.a.name', "an agent's name is its key"),
    ('agent_tool.yaml', 5, 'agents.a.tools[0]',
     "agent 'a' lists tool 'web_search', but a recipe cannot register functi"),
    ('alias_bomb.yaml', 6, 'e', 'the YAML expands to more than 20000 nodes (an alias bomb?)'),
    ('attribute_undefined.yaml', 8, 'flow[0].prompt',
     "undefined template variable: 'str object' has no attribute 'title_case"),
    ('bad_indent.yaml', 5, None, "YAML syntax: expected <block end>, but found '<block mapping start>' ("),
    ('bad_map.yaml', 6, 'flow[0].map', "undefined template variable 'params.items' (declared parameters: none)"),
    ('bomb_center.yaml', 6, 'flow[0].prompt', "template error: the 'center' filter (width 1,000,000,000) would build "),
    ('bomb_doubling.yaml', 6, 'flow[0].prompt',
     "template error: '~' would build 1,048,582 characters or items, more th"),
    ('bomb_format_width.yaml', 6, 'flow[0].prompt',
     "template error: the 'format' filter would build 1,000,000,024 characte"),
    ('bomb_instructions.yaml', 5, 'agents.a.instructions',
     "template error: '*' repeating 17 characters or items 1,000,000,000 tim"),
    ('bomb_join_range.yaml', 6, 'flow[0].prompt',
     "template error: 'join' would build 100,725,690 characters or items, mo"),
    ('bomb_list_repeat.yaml', 8, 'flow[0].prompt',
     "template error: '*' repeating 1 characters or items 100,000,000 times "),
    ('bomb_macro.yaml', 6, 'flow[0].prompt', 'template error: the template takes more than 250,000 steps (loops, cal'),
    ('bomb_nested_loops.yaml', 6, 'flow[0].prompt',
     'template error: the template takes more than 250,000 steps (loops, cal'),
    ('bomb_output.yaml', 8, 'flow[0].prompt', 'template error: the template renders more than 1,000,038 characters'),
    ('bomb_power.yaml', 6, 'flow[0].prompt', 'template error: 10 ** 100000000 would have about 100,000,000 digits, m'),
    ('bomb_repeat.yaml', 6, 'flow[0].prompt', "template error: '*' repeating 1 characters or items 100,000,000 times "),
    ('budget_bool.yaml', 4, 'agents.a.budget', 'expected auto or a whole number of tokens, got True'),
    ('chunk_tokens_zero.yaml', 10, 'flow[0].chunk_tokens', 'must be at least 1, got 0'),
    ('chunks_on_list.yaml', 8, 'flow[0].map', "split: chunks cuts a text, but parameter 'xs' is a list"),
    ('concurrency_bool.yaml', 9, 'flow[0].concurrency', 'expected a whole number, got True'),
    ('concurrency_too_high.yaml', 9, 'flow[0].concurrency', 'must be at most 64, got 100'),
    ('ctx_float.yaml', 3, 'engine.ctx', 'ctx must be auto or a whole number, got 4096.5'),
    ('engine_and_engines.yaml', 4, 'engines', 'give either engine: (one engine) or engines: (several), not both'),
    ('engines_bad_port.yaml', 4, 'engines[1]', "url 'http://127.0.0.1:abc' is not a valid address"),
    ('engines_bad_ipv6.yaml', 3, 'engines[0]', "url 'http://[::1' is not a valid address (Invalid IPv6 URL)"),
    ('engines_no_scheme.yaml', 4, 'engines[1]', "url '127.0.0.1:8081': write the engine's address with its scheme"),
    ('engine_with_url.yaml', 3, 'engine',
     "engine: has no url (it sizes the engine squad launches); to attach to a running server, list it under engines:"),
    ('engines_number.yaml', 4, 'engines[1]', "expected an engine URL (e.g. http://127.0.0.1:8080) or a mapping (url: "
                                             "..., or model: ... for an engine squad launches), got 42"),
    ('engines_same_url.yaml', 4, 'engines[1]',
     "engine URL given twice: http://127.0.0.1:18401 and http://localhost:18401/v1/ are one engine "
     "(http://127.0.0.1:18401) (first on line 3); give each engine once"),
    ('engines_slots_too_many.yaml', 4, 'engines[1]', 'slots must be auto or 1..8, got 9'),
    ('engines_unknown_key.yaml', 4, 'engines[0].slot', "unknown key 'slot'; did you mean 'slots'?"),
    ('engines_url_with_model.yaml', 3, 'engines[0]',
     'model sizes or starts an engine squad launches, but this one is at a url'),
    ('divide_by_zero.yaml', 8, 'flow[1].prompt', 'template error: division by zero (ZeroDivisionError)'),
    ('duplicate_key.yaml', 4, 'agents.a', "duplicate key 'a' (first defined on line 3)"),
    ('duplicate_step_id.yaml', 8, 'flow[1].id', "duplicate step id 'draft'"),
    ('enum_default_not_choice.yaml', 6, 'params.tone.default',
     "default: parameter 'tone' must be one of friendly, formal, got 'frendl"),
    ('enum_without_choices.yaml', 3, 'params.tone', 'an enum parameter needs choices; add choices: [a, b, ...]'),
    ('file_default_missing.yaml', 3, 'params.code.default', "default: parameter 'code': file not found: "),
    ('fixed_prompt_too_big.yaml', 6, 'flow[0].prompt', "raise agents.a.budget"),
    ('flow_empty.yaml', 5, 'flow', 'needs at least one entry, got none'),
    ('include_cycle.yaml', 2, 'include[0]', 'include cycle: cycle_a.yaml -> cycle_b.yaml -> cycle_a.yaml'),
    ('include_missing.yaml', 3, 'include[0]', 'included file not found: '),
    ('instructions_error.yaml', 7, 'agents.a.instructions',
     'template error: integer division or modulo by zero (ZeroDivisionError)'),
    ('item_outside_map.yaml', 6, 'flow[0].prompt', "undefined template variable 'item'"),
    ('later_step.yaml', 7, 'flow[0].prompt', "step 'second' has not finished at this point"),
    ('list_append.yaml', 8, 'flow[0].prompt', "template not allowed by the sandbox: access to attribute 'append' of '"),
    ('list_default_nested.yaml', 5, 'params.xs.default', "default: parameter 'xs' expects a list of plain values"),
    ('main_missing.yaml', 1, 'main', "required key 'main' is missing"),
    ('map_expression.yaml', 8, 'flow[0].map', "map: expected params.NAME, steps.ID.output or steps.ID.outputs, got '{"),
    ('map_int_param.yaml', 8, 'flow[0].map', "map over parameter 'n': a parameter of type int has no items"),
    ('map_text_without_split.yaml', 8, 'flow[0].map',
     "map over parameter 'notes' (type string) needs split: lines, json or c"),
    ('max_tokens_above_budget.yaml', 3, 'agents.a',
     'max_tokens (512) must be below budget (256) so the prompt has room: ra'),
    ('max_tokens_bool.yaml', 5, 'agents.a.max_tokens', 'expected a whole number, got True'),
    ('max_tokens_negative.yaml', 3, 'agents.a.max_tokens', 'must be above 0, got -5'),
    ('max_tokens_quoted.yaml', 5, 'agents.a.max_tokens', "expected a whole number, got '64'"),
    ('max_tool_rounds_zero.yaml', 4, 'agents.a.max_tool_rounds', 'must be at least 1, got 0'),
    ('mcp_both.yaml', 4, 'mcp.notes', 'give a command (a server squad starts) or a url (a streamable-HTTP server)'),
    ('mcp_template.yaml', 7, 'mcp.notes.args[1]',
     "'--db={{ params.db }}': a server's command, args and env are used as"),
    ('mcp_unknown_key.yaml', 4, 'mcp.notes.comand', "unknown key 'comand'; did you mean 'command'?"),
    ('mcp_unknown_server.yaml', 7, 'agents.a.tools[1]',
     "agent 'a' lists tool 'nots.list', but there is no MCP server 'nots'"),
    ('mention_from_sub_agent.yaml', 9, 'flow[0].prompt',
     "only prompts to the main agent ('lead') can @mention sub-agents"),
    ('mention_not_allowed.yaml', 8, 'flow[0].prompt',
     "the main agent 'lead' cannot @mention 'other': add it to agents.lead.a"),
    ('merge_key.yaml', 5, 'agents.a', 'YAML merge keys (<<) are not supported'),
    ('model_directory.yaml', 2, 'model', 'models/dir.gguf is a directory, not a model file'),
    ('model_empty.yaml', 2, 'model', 'models/empty.gguf is empty (0 bytes)'),
    ('model_missing.yaml', 2, 'model', 'model file not found: '),
    ('model_not_gguf.yaml', 2, 'model', "models/not_gguf.gguf is not a GGUF file: it starts with b'PK\\x03\\x04'"),
    ('model_truncated.yaml', 2, 'model', "models/truncated.gguf is truncated: it ends at byte 400, inside the value of "
                                         "metadata key 'tokenizer.ggml.tokens'"),
    ('model_unknown_name.yaml', 2, 'model', "unknown model 'smollm2-13m'"),
    ('name_with_space.yaml', 1, 'name', "recipe name 'my recipe' is not a name: ' ' (U+0020 SPACE) is not allowed"),
    ('not_a_mapping.yaml', 1, None, 'the file must be a mapping (key: value lines) at the top level'),
    ('output_schema_invalid.yaml', 8, 'output.schema',
     "output schema is not a valid JSON schema: 'objekt' is not valid under "),
    ('overlap_too_big.yaml', 8, 'flow[0]', 'overlap (100) must be below chunk_tokens (100)'),
    ('parallel_with_prompt.yaml', 6, 'flow[0]', 'a parallel step holds only id, policy, non_answers and parallel'),
    ('param_bool_default.yaml', 3, 'params.short.default',
     "default: parameter 'short' expects true or false, got 'maybe'"),
    ('param_int_default_text.yaml', 3, 'params.n.default', "default: parameter 'n' expects a whole number, got 'lots'"),
    ('param_unknown_type.yaml', 3, 'params.topic.type',
     "use 'string', 'int', 'number', 'bool', 'enum', 'list' or 'file', got '"),
    ('policy_on_call.yaml', 6, 'flow[0]', 'policy applies only to a parallel step'),
    ('prompt_number.yaml', 6, 'flow[0].prompt', 'expected text, got 1.1'),
    ('python_tag.yaml', 6, 'flow[0].prompt', "YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allo"),
    ('range_too_big.yaml', 6, 'flow[0].prompt',
     'template error: range() of 10,000,000 items is more than the 100,000 a'),
    ('required_and_default.yaml', 3, 'params.topic', 'a parameter is either required or has a default, not both'),
    ('required_typed_stand_in.yaml', 8, 'flow[0].prompt',
     "undefined template variable: 'int object' has no attribute 'upper'"),
    ('required_yes.yaml', 3, 'params.topic.required', "expected true or false, got 'yes'"),
    ('sandbox_mro.yaml', 6, 'flow[0].prompt', "template not allowed by the sandbox: access to attribute '__class__' o"),
    ('slots_bool.yaml', 3, 'engine.slots', 'slots must be auto or a whole number, got True'),
    ('split_unknown.yaml', 9, 'flow[0].split', "use 'lines', 'json' or 'chunks', got 'words'"),
    ('step_id_digit.yaml', 6, 'flow[0].id', "step id '1st' is not a name: '1' (U+0031 DIGIT ONE) cannot start a name"),
    ('step_output_method.yaml', 8, 'flow[1].prompt',
     "undefined template variable: 'str object' has no attribute 'nosuch'"),
    ('sub_agent_tools_text.yaml', 5, 'agents.a.sub_agent_tools', "expected true or false, got 'no'"),
    ('sub_agent_unknown.yaml', 3, 'agents.lead.agents[0]', "unknown agent 'helpr'"),
    ('tab_indent.yaml', 4, None, "YAML syntax: found character '\\t' that cannot start any token (while s"),
    ('temperature_text.yaml', 5, 'agents.a.sampling.temperature', "expected a number, got 'hot'"),
    ('template_syntax.yaml', 6, 'flow[0].prompt',
     "template syntax error: unexpected end of template, expected 'end of pr"),
    ('text_plus_number.yaml', 8, 'flow[0].prompt',
     'template error: can only concatenate str (not "int") to str (TypeError'),
    ('tool_results_bad.yaml', 4, 'agents.a.tool_results', "use 'cut' or 'fail', got 'truncate'"),
    ('two_documents.yaml', 1, None, 'expected exactly one YAML document holding a mapping'),
    ('unclosed_quote.yaml', 8, None, 'YAML syntax: found unexpected end of stream (while scanning a quoted s'),
    ('thinking_budget_at_max_tokens.yaml', 3, 'agents.a', 'thinking_budget (256) must be below max_tokens (256)'),
    ('thinking_budget_negative.yaml', 5, 'agents.a.thinking_budget', 'must be at least 0, got -1'),
    ('thinking_budget_quoted.yaml', 5, 'agents.a.thinking_budget', "expected a whole number, got '64'"),
    ('undefined_variable.yaml', 8, 'flow[0].prompt', "undefined template variable 'params.topc'"),
    ('unknown_agent.yaml', 6, 'flow[0].agent', "unknown agent 'reviwer'"),
    ('unknown_engine_key.yaml', 3, 'engine.slot', "unknown key 'slot'"),
    ('unknown_filter.yaml', 8, 'flow[0].prompt', "template error: unknown filter 'uper'"),
    ('unknown_key.yaml', 5, 'agents.a.max_tokns', "unknown key 'max_tokns'"),
    ('unknown_mention.yaml', 7, 'flow[0].prompt', "unknown agent '@reviwer'"),
    ('unknown_param_key.yaml', 5, 'params.topic.typ', "unknown key 'typ'"),
    ('unknown_sampling_key.yaml', 5, 'agents.a.sampling.temprature', "unknown key 'temprature'"),
    ('unknown_step.yaml', 8, 'flow[1].prompt', "unknown step id 'drfat' in steps.drfat"),
    ('unknown_step_key.yaml', 6, 'flow[0].promt', "unknown key 'promt'"),
    ('unknown_top_key.yaml', 5, 'flwo', "unknown key 'flwo'"),
    ('wrong_type.yaml', 4, 'agents.a.budget', "expected auto or a whole number of tokens, got 'lots'"),
    ('yaml11.yaml', 1, None, 'recipes are read as YAML 1.2'),
    ('mcp_duplicate_tool.yaml', 11, 'agents.a.tools[1]',
     "agent 'a' gets two tools named 'search': web.search and docs.search (t"),
    ('mcp_tool_like_ask.yaml', 8, 'agents.lead.tools[0]',
     "agent 'lead' gets two tools named 'ask_helper': its sub-agent tool for"),
    ('template_self.yaml', 6, 'flow[0].prompt', "does not give text: it is jinja's internal TemplateReference object, "
                                                "which would be sent as <TemplateReference None>"),
    ('template_method_not_called.yaml', 8, 'flow[0].prompt',
     "does not give text: it is the function or method 'upper' itself"),
    ('template_generator.yaml', 8, 'flow[0].prompt', 'does not give text: it is a lazy sequence (generator'),
    ('template_loop_object.yaml', 8, 'flow[0].prompt', "does not give text: it is jinja's internal LoopContext object"),
    ('template_macro_object.yaml', 6, 'flow[0].prompt', "does not give text: it is the macro 'm' itself"),
    ('template_class_in_instructions.yaml', 4, 'agents.a.instructions',
     "does not give text: it is the class 'dict' itself"),
    ('empty_file.yaml', 1, None, 'the file is empty: there is no recipe in it'),
    ('only_separator.yaml', 1, None, "the file holds only '---' and comments: there is no recipe in it"),
    ('null_value.yaml', 5, 'agents.a.max_tokens',
     'expected a whole number, got no value (~, null and nothing after the colon all mean none); write the value or '
     'remove the key to use its default'),
    ('null_required.yaml', 6, 'main',
     'expected text, got no value (~, null and nothing after the colon all mean none); write the value'),
    ('include_directory.yaml', 3, 'include[0]', 'is a directory; give the path of an agents file (.yaml) in it'),
    ('max_tokens_fills_ctx.yaml', 6, 'agents.a.max_tokens',
     'max_tokens 400 fills the whole context the recipe pins (engine.ctx 256'),
    # names in any language (issue 32): the character not allowed is named
    ('unicode_agent_name_mark.yaml', 3, 'agents.리뷰어!',
     "agent name '리뷰어!' is not a name: '!' (U+0021 EXCLAMATION MARK) is not allowed"),
    ('unicode_agent_middle_dot.yaml', 4, 'agents.レビュー・一',
     "agent name 'レビュー・一' is not a name: '・' (U+30FB KATAKANA MIDDLE DOT) is not allowed"),
    ('unicode_step_id_dot.yaml', 6, 'flow[0].id',
     "step id '요약.1' is not a name: '.' (U+002E FULL STOP) is not allowed"),
    ('unicode_param_space.yaml', 3, 'params',
     "parameter name '문 서' is not a name: ' ' (U+0020 SPACE) is not allowed"),
    ('unicode_name_zero_width.yaml', 1, 'name',
     "'\\u200d' (U+200D ZERO WIDTH JOINER) is allowed in a name only after a virama"),
    ('unicode_joiner_after_alef.yaml', 3, 'agents.ها\u200cی',
     "'\\u200c' (U+200C ZERO WIDTH NON-JOINER) is allowed in a name only after a virama (Hindi क्\u200dष) or "
     "between two letters that join across it"),
    ('unicode_mention_suffix.yaml', 7, 'flow[0].prompt', "unknown agent '@리뷰어님'; did you mean '리뷰어'?"),
    ('unicode_mention_glued.yaml', 7, 'flow[0].prompt', "'@レビュー' follows a letter with no space"),
]


def test_the_corpus_is_large_and_every_file_is_accounted_for():
    assert len(CORPUS) >= 60
    names = {c[0] for c in CORPUS}
    on_disk = {p.name for p in BAD.glob("*.yaml")}
    assert on_disk == names | set(HELPERS), "add new files to CORPUS (or HELPERS, with a reason)"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("name", "line", "field", "fragment"), CORPUS, ids=[c[0] for c in CORPUS])
def test_each_bad_recipe_gives_one_clear_error(name, line, field, fragment):
    with pytest.raises(RecipeError) as info:
        validate_recipe(BAD / name)
    err = info.value
    assert err.file is not None and Path(err.file).name == AT.get(name, name)
    assert err.line == line
    assert err.field == field
    assert (field is None) == (name in SYNTAX)
    assert fragment in err.problem
    assert any(word in err.problem.lower() for word in FIXES), f"no fix in: {err.problem}"


def test_cli_validate_reports_every_file_with_exit_2_and_no_traceback(capsys):
    files = [str(BAD / c[0]) for c in CORPUS]
    with pytest.raises(SystemExit) as info:
        squad_main(["recipes", "validate", *files])
    assert info.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.replace("\n", "")  # the console wraps long lines
    assert "Traceback" not in captured.out + err
    assert captured.out.count("OK ") == 0
    assert f"{len(files)} of {len(files)} recipe(s) have errors" in err
    for name, line, *_ in CORPUS:
        assert f"{AT.get(name, name)}:{line}" in err


def test_the_corpus_through_a_real_process_ends_in_time():
    """One ``squad recipes validate`` process over the whole corpus: it must end (a
    subprocess timeout, not a speed assertion) with exit 2 and no traceback."""
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    files = [str(BAD / c[0]) for c in CORPUS]
    done = subprocess.run([sys.executable, "-m", "squad", "recipes", "validate", *files], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.count("error ") >= len(files)
