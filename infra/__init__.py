"""Infrastructure helpers: local PostgreSQL and deployment glue."""
