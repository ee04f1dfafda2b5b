"""The deployable schema: the app's workflow module loaded and its tables created (`app`), the
app's names checked beside duly's (`app_layout`), and Alembic's migrations (`migrate`,
`migrations/`)."""

from __future__ import annotations

from infra.schema.app import create_schema, distinct_metadata, load_app, mapped_classes

__all__ = ["create_schema", "distinct_metadata", "load_app", "mapped_classes"]
