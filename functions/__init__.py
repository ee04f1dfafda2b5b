"""duly's front doors over one request layer: HTTP, the console, the Lambda entries, the CLI."""
