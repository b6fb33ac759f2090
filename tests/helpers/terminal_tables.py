"""Read back the box tables the CLI prints (rich's heavy-head style), column by column.

The checks on the demo's and `slo check`'s terminal output use it: every line within the
width, no header cut short, no column that holds only zeros and dashes.
"""

from __future__ import annotations

import re

HEADER_BAR = "┃"
ROW_BAR = "│"
# A cell that says nothing: a dash, or a zero in any of the units the tables print.
NOTHING = re.compile(r"^(-|-?0+(\.0+)?\s*(ms|s|%|x)?)$")


def tables(text: str) -> list[dict[str, list[str]]]:
    """Each table in `text` as {header: [cell per printed line]}; wrapped headers joined."""
    found: list[dict[str, list[str]]] = []
    headers: list[str] = []
    rows: list[list[str]] = []
    for line in text.splitlines():
        bar = line[:1]
        cells = [cell.strip() for cell in line.strip()[1:-1].split(bar)] if bar else []
        if bar == HEADER_BAR:
            if headers:  # a header wrapped onto a second line
                cells = [f"{a} {b}".strip() for a, b in zip(headers, cells, strict=True)]
            headers = cells
        elif bar == ROW_BAR and headers:
            rows.append(cells)
        elif line.startswith("└") and headers:
            found.append({h: [row[i] for row in rows] for i, h in enumerate(headers)})
            headers, rows = [], []
    return found


def empty_columns(text: str) -> list[str]:
    """Headers of columns whose every non-blank cell is a dash or a zero."""
    return [
        header
        for table in tables(text)
        for header, cells in table.items()
        if all(NOTHING.match(cell) for cell in cells if cell)
    ]


def too_wide(text: str, width: int = 100) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]
