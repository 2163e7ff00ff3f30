"""What the commands print: tables of rows, numbers to four significant digits, missing values as ``-``."""

from __future__ import annotations

import pandas as pd


def print_table(rows: list[dict[str, object]]) -> None:
    """Print ``rows`` (one dict per row, the same keys) as an aligned table."""
    frame = pd.DataFrame(rows)
    print(frame.to_string(index=False, na_rep="-", float_format=lambda x: f"{x:.4g}"))
