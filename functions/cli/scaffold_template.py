"""The SAM template `duly init` writes: duly's own template.yaml, made an app's.

One template, not two: the app's differs from duly's only in its code (the
app's `src/`), its module, its revisions and its description. Run
`python -m functions.cli.scaffold_template` after changing template.yaml;
tests/test_init.py checks the scaffold's copy is what this makes of it.
"""

from __future__ import annotations

from pathlib import Path

from engine import ConfigurationError

SCAFFOLD_TEMPLATE = Path(__file__).resolve().parent / "scaffold" / "template.yaml.tmpl"
# What in duly's template is duly's, and what an app's says instead ({{package}} filled in).
CHANGES = (
    (
        "  duly: durable workflows on PostgreSQL, run by Lambda functions and woken by\n"
        "  EventBridge Scheduler.\n",
        "  {{package}}: durable workflows on duly, run by Lambda functions and woken by\n"
        "  EventBridge Scheduler.\n",
    ),
    (
        "    Default: functions.examples\n",
        "    Default: {{package}}.workflows\n",
    ),
    (
        '      only functions.examples).\n    Default: ""\n',
        "      only functions.examples).\n    Default: migrations\n",
    ),
    ("    CodeUri: deploy/\n", "    CodeUri: src/\n"),
)


def app_template(duly_template: str) -> str:
    """duly's template.yaml text as an app's: each of CHANGES made exactly once."""
    text = duly_template
    for duly_s, app_s in CHANGES:
        if text.count(duly_s) != 1:
            raise ConfigurationError(
                f"template.yaml no longer holds {duly_s.strip()!r} once: update CHANGES."
            )
        text = text.replace(duly_s, app_s)
    return text


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2] / "template.yaml"
    SCAFFOLD_TEMPLATE.write_text(app_template(root.read_text()))
