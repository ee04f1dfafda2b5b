"""duly's Lambda entries (template.yaml): the handlers, the container's runtime, their work."""
