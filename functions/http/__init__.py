"""duly's HTTP front door: the app factory (`functions.http.app`), its guard, errors and routes.

This package's own import runs nothing: the console imports `errors` and
`state` from here while the factory imports the console, so neither may
come in through this file.
"""
