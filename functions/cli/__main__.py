"""`python -m functions.cli` is the `duly` script."""

from __future__ import annotations

from functions.cli import main

main()
