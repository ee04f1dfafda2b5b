"""The model-change bridge's tables: its own copies of the event tables, and the models whose
changes it publishes (or does not)."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import ClassVar

from sqlalchemy import ForeignKey, LargeBinary, Numeric, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from engine import (
    declare_engine_tables,
)


class BridgeBase(DeclarativeBase):
    """The bridge tests' base."""


BridgeOutbox = declare_engine_tables(BridgeBase, attempts=False, prefix="bridge_").outbox


class Parcel(BridgeBase):
    """Opted in: its inserts, updates and deletes are published."""

    __tablename__ = "bridge_parcels"
    __publish_changes__: ClassVar[bool] = True

    id: Mapped[int] = mapped_column(primary_key=True)
    address: Mapped[str | None] = mapped_column(String, default=None)
    status: Mapped[str] = mapped_column(String, default="new")
    weight: Mapped[Decimal | None] = mapped_column(Numeric(10, 3), default=None)
    ship_on: Mapped[date | None] = mapped_column(default=None)
    scanned_at: Mapped[datetime | None] = mapped_column(default=None)
    # Private: stored, never published (the column's name has no underscore).
    _courier_note: Mapped[str | None] = mapped_column("courier_note", String, default=None)


class Scan(BridgeBase):
    """Opted in, with a column JSON cannot hold."""

    __tablename__ = "bridge_scans"
    __publish_changes__: ClassVar[bool] = True

    id: Mapped[int] = mapped_column(primary_key=True)
    image: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)


class Route(BridgeBase):
    """Not opted in; its stops are, and are removed with it or as orphans."""

    __tablename__ = "bridge_routes"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String)
    stops: Mapped[list[Stop]] = relationship(
        back_populates="route", cascade="all, delete-orphan", lazy="selectin"
    )


class Stop(BridgeBase):
    """Opted in, with a primary key of two columns."""

    __tablename__ = "bridge_stops"
    __publish_changes__: ClassVar[bool] = True

    route_id: Mapped[int] = mapped_column(ForeignKey("bridge_routes.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    place: Mapped[str] = mapped_column(String)
    route: Mapped[Route] = relationship(back_populates="stops")


class Crate(BridgeBase):
    """Not opted in: its changes publish nothing."""

    __tablename__ = "bridge_crates"

    id: Mapped[int] = mapped_column(primary_key=True)
    label: Mapped[str] = mapped_column(String)
