"""duly's handlers and app: the FastAPI app, the CLI and (later) the Lambda entry points."""
