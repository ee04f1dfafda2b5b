"""Constants of ours written into a statement's text, not sent as parameters.

SQLAlchemy sends every Python value in an expression as a bind parameter,
constants included: a status, a step's name, a JSON key, a NOTIFY channel.
Each is dumped and sent again at every execution of a statement sent
thousands of times a second (the publish statement carried sixteen). A
constant the engine itself chose is written into the text instead; a
value that comes from a user stays a parameter.
"""

from __future__ import annotations

from sqlalchemy import Integer, Text, literal_column
from sqlalchemy.sql.elements import ColumnElement

# Untyped: a number of seconds times it is an interval to PostgreSQL, which SQLAlchemy's
# Interval type (it has no multiplication) would refuse to render.
SECOND: ColumnElement[object] = literal_column("interval '1 second'")


def text_constant(value: str) -> ColumnElement[str]:
    """`value` as a quoted SQL string literal of type text."""
    return literal_column("'" + value.replace("'", "''") + "'", Text())


def int_constant(value: int) -> ColumnElement[int]:
    """`value` as an SQL integer literal."""
    return literal_column(str(int(value)), Integer())
