"""The event layer's settings from DULY_* variables: their names, defaults and minimums.

- DULY_MODE is stripped and lowercased; "production" selects production, "local"
  and anything else local: test_the_mode_is_production_only_when_it_says_so
- async delivery defaults to the mode (on in production); an explicit value wins:
  test_async_delivery_follows_the_mode_unless_set
- dead letters default on; an explicit off disables them:
  test_dead_letters_are_on_unless_turned_off
- whole numbers parse with int(), are raised to their minimum, and fall back to
  their default when they do not parse: test_whole_numbers_default_clamp_and_parse
- a yes/no variable that is neither is refused, naming it:
  test_a_flag_that_is_neither_yes_nor_no_is_refused
"""

from __future__ import annotations

import logging

import pytest

from engine import ConfigurationError, EventSettings

DEFAULTS = {
    "outbox_batch_size": 100,
    "outbox_process_chunk_size": 50,
    "outbox_claim_ttl_seconds": 300,
    "max_retries": 3,
    "retry_backoff_seconds": 5,
    "delivery_running_timeout_seconds": 300,
}
MINIMUMS = {
    "outbox_batch_size": 1,
    "outbox_process_chunk_size": 1,
    "outbox_claim_ttl_seconds": 1,
    "max_retries": 0,
    "retry_backoff_seconds": 1,
    "delivery_running_timeout_seconds": 1,
}


def variable(field: str) -> str:
    return "DULY_" + field.upper()


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        ("production", "production"),
        ("  PRODUCTION \n", "production"),
        ("Production", "production"),
        ("local", "local"),
        ("staging", "local"),
        ("", "local"),
        ("prod", "local"),
    ],
)
def test_the_mode_is_production_only_when_it_says_so(value: str, mode: str) -> None:
    settings = EventSettings.from_env({"DULY_MODE": value})
    assert settings.mode == mode
    assert settings.production is (mode == "production")


def test_async_delivery_follows_the_mode_unless_set() -> None:
    assert EventSettings.from_env({}).async_delivery is False
    assert EventSettings.from_env({"DULY_MODE": "production"}).async_delivery is True
    off = EventSettings.from_env({"DULY_MODE": "production", "DULY_ASYNC": "off"})
    assert off.async_delivery is False
    assert EventSettings.from_env({"DULY_ASYNC": "YES"}).async_delivery is True
    assert EventSettings.from_env({"DULY_ASYNC": "  "}).async_delivery is False  # empty: unset


def test_dead_letters_are_on_unless_turned_off() -> None:
    assert EventSettings.from_env({}).dead_letter_enabled is True
    for word in ("0", "false", "No", "OFF"):
        assert (
            EventSettings.from_env({"DULY_DEAD_LETTER_ENABLED": word}).dead_letter_enabled is False
        )
    assert EventSettings.from_env({}).signal_bridge is False
    assert EventSettings.from_env({"DULY_SIGNAL_BRIDGE": "1"}).signal_bridge is True


@pytest.mark.parametrize("field", list(DEFAULTS))
def test_whole_numbers_default_clamp_and_parse(
    field: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = variable(field)
    assert getattr(EventSettings.from_env({}), field) == DEFAULTS[field]
    assert getattr(EventSettings.from_env({name: " 42 "}), field) == 42
    assert getattr(EventSettings.from_env({name: "-5"}), field) == MINIMUMS[field]
    assert getattr(EventSettings.from_env({name: "0"}), field) == max(0, MINIMUMS[field])
    with caplog.at_level(logging.WARNING, logger="duly.settings"):
        assert getattr(EventSettings.from_env({name: "ten"}), field) == DEFAULTS[field]
        assert getattr(EventSettings.from_env({name: "2.5"}), field) == DEFAULTS[field]
    assert name in caplog.text


def test_a_flag_that_is_neither_yes_nor_no_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="DULY_DEAD_LETTER_ENABLED") as refused:
        EventSettings.from_env({"DULY_DEAD_LETTER_ENABLED": "maybe"})
    assert "'maybe'" in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_the_environment_is_read_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DULY_MODE", "production")
    monkeypatch.setenv("DULY_MAX_RETRIES", "7")
    settings = EventSettings.from_env()
    assert (settings.mode, settings.max_retries) == ("production", 7)
