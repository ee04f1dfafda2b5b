"""The one Jinja2 environment of the console, and where its static files are served."""

from __future__ import annotations

from pathlib import Path

from fastapi.templating import Jinja2Templates

HERE = Path(__file__).parent
STATIC_URL = "/console/static"
STATIC_DIRECTORY = HERE / "static"

templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals["static_url"] = STATIC_URL
