"""Taking due work: the claim, limit groups, the next due instant, stranded runs."""
