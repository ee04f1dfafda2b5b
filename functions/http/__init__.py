"""duly's HTTP front door: its guard, errors, state and routes; `functions.app` builds the app.

Nothing here imports the console: the console imports `errors`, `state`,
`guard` and `segments` from here, and `functions.app` includes both.
"""
