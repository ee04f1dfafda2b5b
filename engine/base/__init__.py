"""What every layer stands on: errors, the database clock, cron, settings, SQL helpers."""
