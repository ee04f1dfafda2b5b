"""Reads for people: pages of runs, one run, the overview, the last hour."""
