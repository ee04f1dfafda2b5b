"""Step arguments are checked against the step's annotations where the call is built.

pydantic in strict JSON mode, on the JSON a run is handed: a value that does
not fit is a StepError before anything is written, not a failed attempt later.
"""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import Field

from engine import StepError, Workflow, connect_workflows, step
from tests.apps import api
from tests.apps.api import Invoice
from tests.conftest import Database
from tests.helpers import fetch


def test_a_value_of_the_wrong_type_is_refused_naming_the_step_parameter_and_value() -> None:
    with pytest.raises(StepError, match=r"Step Invoice\.pay does not accept amount='lots': "):
        Invoice.pay("lots")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"by=3"):
        Invoice.pay(1, by=3)  # type: ignore[arg-type]


def test_strict_text_is_not_a_number_nor_a_bool_an_int() -> None:
    for wrong in ("12", 12.5, True, None):
        with pytest.raises(StepError, match="amount="):
            Invoice.pay(wrong)  # type: ignore[arg-type]
    assert Invoice.pay(12).encoded == {"args": [12], "kwargs": {}}


def test_json_compatible_values_pass_as_their_json() -> None:
    assert Invoice.issue("gold").args == ("gold",)
    with pytest.raises(StepError, match="plan='platinum'"):
        Invoice.issue("platinum")  # type: ignore[arg-type]
    # A tuple is a JSON array, and an ISO string a datetime: the run gets the JSON.
    assert Invoice.tag(("a", "b")).args == (("a", "b"),)
    assert Invoice.anything(1, at="2030-01-01T00:00:00+00:00").kwargs == {
        "at": "2030-01-01T00:00:00+00:00"
    }  # type: ignore[arg-type]


def test_star_args_and_star_kwargs_are_checked_item_by_item() -> None:
    assert Invoice.tag(["a"], 1, 2, weight=1.5, count=2).kwargs == {"weight": 1.5, "count": 2}
    with pytest.raises(StepError, match=r"extra\.1='x'"):
        Invoice.tag(["a"], 1, "x")  # type: ignore[arg-type]
    with pytest.raises(StepError, match=r"more\.weight='heavy'"):
        Invoice.tag(["a"], weight="heavy")  # type: ignore[arg-type]


def test_unannotated_and_any_parameters_take_anything_json() -> None:
    call = Invoice.anything({"deep": [1, None, "x"]}, other=[{"a": 1}])
    assert call.encoded == {"args": [{"deep": [1, None, "x"]}], "kwargs": {"other": [{"a": 1}]}}


def test_not_json_is_still_refused_first_and_nan_with_it() -> None:
    with pytest.raises(StepError, match="JSON-serializable"):
        Invoice.anything(object())
    with pytest.raises(StepError, match="JSON-serializable"):
        Invoice.anything(float("nan"))


def test_annotated_constraints_apply() -> None:
    class Shop:
        @step
        async def restock(self, count: Annotated[int, Field(gt=0)]) -> None: ...

    Shop.restock.owner = Shop
    assert Shop.restock(3).args == (3,)
    with pytest.raises(StepError, match="count=0: Input should be greater than 0"):
        Shop.restock(0)


class Later:
    """Annotations naming what is defined after the class (resolved at the first call)."""

    @step
    async def go(self, size: Size, where: Unresolvable) -> None: ...  # type: ignore[name-defined]  # noqa: F821


Size = int


def test_annotations_resolve_at_the_first_call_and_the_unresolvable_are_unchecked() -> None:
    assert Later.go(1, where={"any": "thing"}).args == (1,)  # type: ignore[arg-type]
    with pytest.raises(StepError, match="size='big'"):
        Later.go("big", where=1)  # type: ignore[arg-type]


def test_a_class_pydantic_cannot_check_is_accepted_unchecked() -> None:
    class Opaque:
        pass

    class Holder:
        @step
        async def take(self, thing: Opaque, count: int) -> None: ...

    Holder.take.owner = Holder
    assert Holder.take("anything", 1).args == ("anything", 1)  # type: ignore[arg-type]
    with pytest.raises(StepError, match="count='1'"):
        Holder.take("anything", "1")  # type: ignore[arg-type]


def test_the_model_is_built_once_per_step() -> None:
    model = Invoice.pay.arguments
    Invoice.pay(1)
    assert Invoice.pay.arguments is model
    schema = model.model.model_json_schema(by_alias=True)
    assert schema["properties"]["amount"]["type"] == "integer"
    assert schema["properties"]["by"]["default"] == "card"


def test_call_named_builds_the_same_call_as_python() -> None:
    assert (
        Invoice.pay.call_named({"amount": 5, "by": "cash"}).encoded
        == Invoice.pay(5, by="cash").encoded
    )
    named = Invoice.tag.call_named({"labels": ["a"], "extra": [1, 2], "more": {"w": 1.0}})
    assert named.encoded == Invoice.tag(["a"], 1, 2, w=1.0).encoded
    with pytest.raises(StepError, match="no parameter 'colour'"):
        Invoice.pay.call_named({"amount": 1, "colour": "red"})


async def test_a_refused_delivery_writes_nothing(db: Database) -> None:

    Session = await db.create(api.Base.metadata)
    async with connect_workflows(Session):
        invoice = Invoice(number="V-1", total=10)
        assert await invoice.start(Invoice.chase)
        with pytest.raises(StepError):
            await Invoice.by(Invoice.id == invoice.id).deliver(Invoice.pay("lots"))  # type: ignore[arg-type]
    row = await fetch(Session, Invoice, invoice.id)
    assert (row.next_step, row.pending_event) == ("chase", None)


def test_steps_of_a_workflow_class_resolve_in_their_module() -> None:
    assert issubclass(Invoice, Workflow)
    assert Invoice.pay.arguments.checked
    assert not Invoice.chase.arguments.checked
    assert isinstance(Invoice.anything.arguments.model.model_fields, dict)
    unchecked: Any = Invoice.anything.arguments.checked
    assert unchecked is True  # `at` is annotated: a datetime or None
