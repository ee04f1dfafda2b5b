"""The Workflow mixin, what a step returns, and starting and addressing runs."""
