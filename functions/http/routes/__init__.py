"""The API's routers, one module per resource; `functions.http.app` includes them all."""
