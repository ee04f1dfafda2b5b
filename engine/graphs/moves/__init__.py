"""The moves side of graph workflows: instances submitted, their branches moved, written."""
