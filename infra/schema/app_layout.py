"""The app's names beside duly's: an app may not be, or hold, a package named like one of duly's.

duly installs the top-level packages `engine`, `functions` and `infra`. A Lambda bundle puts
every dependency beside the app's code in one directory, so an app package (or a folder of
the app's root) of one of those names would merge with duly's, or hide it, silently.
`check_app_layout` refuses that at start (`duly dev`, every `duly` command that imports the
app, the Lambda runtime: all through `infra.schema.load_app`); `duly init` refuses the name.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from engine import ConfigurationError

DULY_PACKAGES = ("engine", "functions", "infra")  # duly's top-level packages
OWN_APP = "functions.examples"  # duly's example app, the one app allowed inside duly's packages
WHY = (
    "duly installs top-level packages named engine, functions and infra, and a Lambda bundle "
    "puts dependencies beside the app's code in one directory, so the two would merge or one "
    "would hide the other"
)


def check_package_name(name: str) -> None:
    """ConfigurationError unless `name` can be an app's top-level package beside duly's."""
    if not name.isidentifier():
        raise ConfigurationError(
            f"{name!r} cannot name a Python package: use letters, digits and underscores, "
            "not starting with a digit."
        )
    if name in DULY_PACKAGES:
        raise ConfigurationError(
            f"The app's package cannot be named {name!r}: {WHY}. Choose another name."
        )


def check_app_layout(app_module: str, root: Path | None = None) -> None:
    """ConfigurationError if DULY_APP lives in one of duly's packages (other than duly's own
    example app), or if `root` (default: the current directory, which is the bundle's root on
    Lambda) or the folder of the app's package has a folder named like one of duly's packages
    that is not duly's own."""
    top = app_module.split(".", 1)[0]
    is_own_app = app_module == OWN_APP or app_module.startswith(OWN_APP + ".")
    if top in DULY_PACKAGES and not is_own_app:
        raise ConfigurationError(
            f"DULY_APP={app_module} is inside a package named {top!r}: {WHY}. Move the app's "
            "workflows into a package of another name."
        )
    for base in app_roots(top, root):
        for name in DULY_PACKAGES:
            folder = base / name
            if folder.is_dir() and not same_folder(folder, installed_folder(name)):
                raise ConfigurationError(
                    f"The folder {folder} shadows duly's package {name!r}: {WHY}. Rename the "
                    "app's folder."
                )


def app_roots(top: str, root: Path | None) -> list[Path]:
    """Where the app's code sits: `root` (default: the current directory), and the folder
    that holds the app's top-level package (src/ in a scaffolded app; found, not imported)."""
    roots = [Path.cwd() if root is None else root]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None  # load_app says what is missing
    if spec is not None and spec.origin is not None and spec.origin != "built-in":
        origin = Path(spec.origin)
        package_folder = origin.parent if origin.name == "__init__.py" else origin
        roots.append(package_folder.parent)
    return roots


def installed_folder(package: str) -> Path:
    """The folder of duly's own top-level `package` (this installation's)."""
    here = Path(__file__).resolve().parents[2]  # beside infra/ sit engine/ and functions/
    return here / package


def same_folder(one: Path, other: Path) -> bool:
    """Whether two paths name the same folder (symbolic links and case followed)."""
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False
