"""Where the parts that sit beside dflash_core/ in a clone (assets/, ui/) are, in both layouts.

A wheel ships them inside the package (dflash_core/assets, dflash_core.ui), so an installed copy
has one top-level name; an editable install maps dflash_core.ui to the clone's ui/.
"""

import importlib
import importlib.util
from importlib.resources import files
from pathlib import Path


def _assets_dir() -> Path:
    packaged = Path(str(files(__package__) / "assets"))
    if packaged.is_dir():  # installed from a wheel
        return packaged
    return Path(__file__).resolve().parent.parent / "assets"  # a clone, installed editable or not


ASSETS = _assets_dir()


def playground_package():
    """The playground's package (it has `build_app`): dflash_core.ui when installed, from a wheel
    or editable; the clone's top-level ui/ when the clone is run without installing it."""
    installed = importlib.util.find_spec(f"{__package__}.ui") is not None
    return importlib.import_module(f"{__package__}.ui" if installed else "ui")
