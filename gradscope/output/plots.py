"""The one way a gradscope plot is made and written: matplotlib (the ``plot`` extra) on its
file-only backend, the figure laid out, written atomically as a PNG, and closed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import MissingExtraError
from .files import atomic_path


def pyplot(what: str) -> Any:
    """``matplotlib.pyplot`` on the Agg backend; ``what`` names the plot in the error that
    says how to install matplotlib when it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError(
            f"{what} needs matplotlib, which is not installed; pip install "
            "'torch-gradscope[plot]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: str | Path, *, dpi: int = 100) -> Path:
    """Lay ``fig`` out and write it to ``path`` atomically as a PNG (the previous file stays
    if writing fails); the figure is closed either way."""
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")  # legends outside
    finally:
        plt.close(fig)
    return Path(path)
