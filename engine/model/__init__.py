"""The mapped workflow classes, their steps and limits, and the process's database."""
