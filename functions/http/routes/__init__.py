"""The API's routers, one module per resource; `functions.app` includes them all."""
