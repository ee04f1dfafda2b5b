"""The console: server-rendered pages (Jinja2 and htmx) over the engine's own queries.

`console_router` gathers the pages under /console; `create_app` includes it,
so the console is served wherever the API is (`duly dev`, the Function URL).
Each page module owns one view and its templates (`templates/<view>/`).
"""
