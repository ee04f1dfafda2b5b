"""Choosing the process's workflow engine, rule by rule (seed 000, "Backends": the
WORKFLOW_ENGINE paragraphs, as DULY_WORKFLOW_ENGINE and DULY_MODE).

- configure_workflow_engine() sets or clears the process-local active engine:
  test_configure_sets_the_active_engine_and_none_clears_it
- get_workflow_engine() reuses the active engine when present:
  test_the_active_engine_is_reused
- otherwise it reads the settings and installs one process-local default for
  later calls: test_without_an_active_engine_the_settings_install_one_default
- None or a missing setting means the mode default: LocalWorkflowEngine, or
  the durable engine (our CeleryWorkflowEngine) when the mode is production;
  the mode is stripped and lowercased, any other value is local:
  test_the_mode_default_is_durable_in_production_and_local_otherwise
- the production default runs executions in the database:
  test_the_production_default_runs_executions_in_the_database
- the setting takes precedence over the mode default:
  test_the_setting_takes_precedence_over_the_mode
- accepted values: an engine instance; a dotted path to an instance, class or
  zero-argument factory; a class or factory callable; a mapping with class and
  optional options passed as keyword arguments (JSON text in the variable), other
  keys ignored: test_every_accepted_kind_of_value_resolves_to_an_engine,
  test_a_mapping_passes_its_options_as_keyword_arguments
- mapping options must be a mapping: test_mapping_options_must_be_a_mapping
- non-None settings must resolve to a workflow engine:
  test_a_setting_that_names_no_engine_is_refused
- import, factory and constructor errors propagate:
  test_import_factory_and_constructor_errors_propagate
- configure_workflow_engine_from_settings chooses from given settings (the
  event layer's EventSettings included) or the environment:
  test_configure_from_settings_installs_what_the_settings_name
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import (
    ConfigurationError,
    EventSettings,
    LocalWorkflowEngine,
    WorkflowState,
    connect_workflows,
)
from engine.executions.configure import (
    WorkflowEngineSettings,
    configure_workflow_engine,
    configure_workflow_engine_from_settings,
    get_workflow_engine,
    resolve_workflow_engine,
)
from engine.executions.durable import DurableWorkflowEngine
from engine.testing import drain
from tests.apps import executions as app
from tests.conftest import Database

LOCAL = WorkflowEngineSettings()
PRODUCTION = WorkflowEngineSettings(mode="production")


@pytest.fixture(autouse=True)
def no_active_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no active engine and neither variable set."""
    monkeypatch.delenv("DULY_MODE", raising=False)
    monkeypatch.delenv("DULY_WORKFLOW_ENGINE", raising=False)
    configure_workflow_engine(None)
    yield
    configure_workflow_engine(None)


def test_configure_sets_the_active_engine_and_none_clears_it() -> None:
    chosen = LocalWorkflowEngine()
    configure_workflow_engine(chosen)
    assert get_workflow_engine() is chosen
    configure_workflow_engine(None)
    assert get_workflow_engine() is not chosen


def test_the_active_engine_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = LocalWorkflowEngine()
    configure_workflow_engine(chosen)
    monkeypatch.setenv("DULY_MODE", "production")  # the settings are not read again
    assert get_workflow_engine() is chosen
    assert get_workflow_engine() is chosen


def test_without_an_active_engine_the_settings_install_one_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = get_workflow_engine()
    assert type(first) is LocalWorkflowEngine
    monkeypatch.setenv("DULY_MODE", "production")
    assert get_workflow_engine() is first  # installed: later calls reuse it
    configure_workflow_engine(None)
    assert isinstance(get_workflow_engine(), DurableWorkflowEngine)  # read again once cleared


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (None, LocalWorkflowEngine),
        ("local", LocalWorkflowEngine),
        ("staging", LocalWorkflowEngine),
        ("", LocalWorkflowEngine),
        ("production", DurableWorkflowEngine),
        ("  Production \n", DurableWorkflowEngine),
    ],
)
def test_the_mode_default_is_durable_in_production_and_local_otherwise(
    monkeypatch: pytest.MonkeyPatch, mode: str | None, expected: type
) -> None:
    if mode is not None:
        monkeypatch.setenv("DULY_MODE", mode)
    assert type(get_workflow_engine()) is expected
    env = {} if mode is None else {"DULY_MODE": mode}
    for settings in (WorkflowEngineSettings.from_env(env), EventSettings.from_env(env)):
        assert type(resolve_workflow_engine(None, settings)) is expected


async def test_the_production_default_runs_executions_in_the_database(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    Session = await db.create(app.Base.metadata)
    monkeypatch.setenv("DULY_MODE", "production")
    engine = get_workflow_engine()
    assert isinstance(engine, DurableWorkflowEngine)
    app.register_all(engine)
    async with connect_workflows(Session):
        started = await engine.start(app.DOUBLING, {"n": 8})
        await drain(Session)
        done = await get_workflow_engine().status(started.execution_id)
    assert (done.state, done.output_data) == (WorkflowState.COMPLETED, {"double": 16})
    assert db.sql("SELECT workflow_id, state FROM duly_executions") == [("doubling", "completed")]


def test_the_setting_takes_precedence_over_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DULY_MODE", "production")
    monkeypatch.setenv("DULY_WORKFLOW_ENGINE", " tests.apps.executions.SHARED_ENGINE ")
    assert get_workflow_engine() is app.SHARED_ENGINE


def test_every_accepted_kind_of_value_resolves_to_an_engine() -> None:
    instance = LocalWorkflowEngine()
    assert resolve_workflow_engine(instance, LOCAL) is instance
    assert resolve_workflow_engine("tests.apps.executions.SHARED_ENGINE", LOCAL) is (
        app.SHARED_ENGINE
    )
    assert resolve_workflow_engine("tests.apps.executions:SHARED_ENGINE", LOCAL) is (
        app.SHARED_ENGINE
    )
    for value in (
        "engine.executions.local.LocalWorkflowEngine",  # a class, by path
        "tests.apps.executions.make_local_engine",  # a factory, by path
        LocalWorkflowEngine,  # a class
        app.make_local_engine,  # a factory
        {"class": "engine.LocalWorkflowEngine"},  # a mapping without options
        {"class": LocalWorkflowEngine, "options": None, "ignored": 1},
        '{"class": "engine.LocalWorkflowEngine", "extra": [1]}',  # JSON text
    ):
        made = resolve_workflow_engine(value, PRODUCTION)
        assert type(made) is LocalWorkflowEngine, value
        assert made is not app.SHARED_ENGINE


async def test_a_mapping_passes_its_options_as_keyword_arguments(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    Session = await db.create(app.Base.metadata, app.OtherBase.metadata)
    monkeypatch.setenv(
        "DULY_WORKFLOW_ENGINE",
        '{"class": "engine.executions.durable.DurableWorkflowEngine",'
        ' "options": {"executions": "tests.apps.executions.ArchivedExecution"}}',
    )
    engine = get_workflow_engine()
    assert isinstance(engine, DurableWorkflowEngine)
    app.register_all(engine)
    async with connect_workflows(Session):
        started = await engine.start(app.NOOP)
        await drain(Session)
        assert (await engine.status(started.execution_id)).state == WorkflowState.COMPLETED
    assert db.sql("SELECT count(*) FROM archived_executions") == [(1,)]
    assert db.sql("SELECT count(*) FROM duly_executions") == [(0,)]


def test_mapping_options_must_be_a_mapping() -> None:
    for options in ([1], "executions=x"):
        with pytest.raises(ConfigurationError, match="options must be a mapping"):
            resolve_workflow_engine({"class": LocalWorkflowEngine, "options": options}, LOCAL)
    with pytest.raises(ConfigurationError, match="needs a 'class'"):
        resolve_workflow_engine({"options": {}}, LOCAL)


def test_a_setting_that_names_no_engine_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in (
        "collections.OrderedDict",  # a class whose instances are not engines
        "tests.apps.executions.make_nothing",
        app.make_nothing,
        {"class": "builtins.dict", "options": {"a": 1}},
        42,
    ):
        with pytest.raises(ConfigurationError, match="not a workflow engine"):
            resolve_workflow_engine(value, LOCAL)
    monkeypatch.setenv("DULY_WORKFLOW_ENGINE", "collections.OrderedDict")
    with pytest.raises(ConfigurationError):
        get_workflow_engine()
    monkeypatch.delenv("DULY_WORKFLOW_ENGINE")
    assert type(get_workflow_engine()) is LocalWorkflowEngine  # nothing was installed


def test_import_factory_and_constructor_errors_propagate() -> None:
    with pytest.raises(ModuleNotFoundError):
        resolve_workflow_engine("no_such_package.Engine", LOCAL)
    with pytest.raises(ImportError):
        resolve_workflow_engine("tests.apps.executions.NoSuchEngine", LOCAL)
    with pytest.raises(RuntimeError, match="the factory broke"):
        resolve_workflow_engine("tests.apps.executions.broken_factory", LOCAL)
    with pytest.raises(TypeError):
        resolve_workflow_engine({"class": LocalWorkflowEngine, "options": {"nope": 1}}, LOCAL)
    with pytest.raises(ConfigurationError, match="WorkflowExecutionRecord"):
        resolve_workflow_engine(
            {"class": DurableWorkflowEngine, "options": {"executions": "builtins.dict"}}, LOCAL
        )


def test_configure_from_settings_installs_what_the_settings_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    durable = configure_workflow_engine_from_settings(EventSettings(mode="production"))
    assert isinstance(durable, DurableWorkflowEngine)
    assert get_workflow_engine() is durable
    named = configure_workflow_engine_from_settings(
        EventSettings(workflow_engine="tests.apps.executions.SHARED_ENGINE")
    )
    assert named is app.SHARED_ENGINE is get_workflow_engine()
    monkeypatch.setenv("DULY_MODE", "production")
    from_env = configure_workflow_engine_from_settings()
    assert isinstance(from_env, DurableWorkflowEngine) and from_env is not durable
    assert get_workflow_engine() is from_env
