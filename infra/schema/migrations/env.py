"""duly's Alembic environment, for the example app's revisions and every app's own.

The work is `infra.schema.migrate.run_env`, typed and tested there: the target is the
deployable schema (DULY_APP's tables, duly's `duly_wake_schedule`,
`duly_wake_slots` and `duly_clock`), online through an async psycopg engine's
`run_sync`, offline as SQL.
"""

from infra.schema.migrate import run_env

run_env()
