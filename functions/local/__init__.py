"""Local development: `duly dev` and `duly db-url` (`command`), the dev app (`dev`), and the
AWS loop run on this machine (`serverless`). Needs duly's `local` extra, which deploys lack.

`functions.cli` imports this package only once a command that needs it is asked for.
"""

from functions.local.command import print_db_url, run_dev

__all__ = ["print_db_url", "run_dev"]
