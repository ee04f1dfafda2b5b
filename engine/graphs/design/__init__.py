"""The design side of graph workflows: templates drawn, checked, versioned, read as graphs."""
