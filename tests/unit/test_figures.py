"""Every published figure has one source: the figures that README.md, docs/ and
``feature-store plan`` quote are read back from the results files they cite, so a results
file re-run without the docs (or a doc edited without a run) fails here.

- ``feature_store.capacity.FIGURES``: each figure is the cell of its row and column in the
  table of its results file.
- README.md and docs/*.md: a table row, a list item or a paragraph that links a results
  file (``benchmarks/results/NAME``, or a file in a folder of it), or a table or list
  under a paragraph that does, quotes only figures found in the files it links (a table
  row whose first cell is the label of a row there: in that row). A
  figure is a number followed by a space and a unit of measure (µs, ms, s, B, KB, MB, GiB,
  req/s, records/s, cores) or right after it by a ratio's or a share's sign (x, the
  multiplication sign, %), or a number in a run of them that ends in one ("26.4 to 28.2
  µs", "9.7 / 7.4 µs"). It is found where the file has the same number, or one with more
  decimals that rounds to it, not as part of a longer one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from feature_store.capacity import FIGURES

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "benchmarks/results/"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
# after a space; a ratio or a share right after its number
UNIT = (
    r"(?: (?:µs|us|ms|s|B|KB|MB|GB|GiB|MiB|bytes/value|B/value|bytes|req/s|requests/s|records/s"
    r"|rows/s|values/s|events/s|lookups/s|entity reads|reads|cores)|[\u00d7x%])"
)
# a run of numbers joined by "to", "/", an en dash, "and" or commas, ending in a unit
RUN = re.compile(
    rf"(?<![\w.,/#-])((?:{NUMBER})(?:\s*(?:to|/|\u2013|and|,|or)\s*(?:{NUMBER}))*){UNIT}(?![\w/])"
)
LINK = re.compile(r"benchmarks/results/([\w.-]+(?:/[\w.-]+)*\.(?:md|json))")


def cell(path: str, row: tuple[str, ...], column: str) -> str:
    """The cell of ``column`` in the row of a markdown table of ``path`` whose first cells
    are ``row``."""
    heading: list[str] = []
    for line in (ROOT / path).read_text().splitlines():
        if not line.startswith("|"):
            heading = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not heading:
            heading = cells
        elif tuple(cells[: len(row)]) == row and column in heading:
            return cells[heading.index(column)]
    raise AssertionError(f"{path} has no row {row} with a column {column!r}")


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_each_planning_figure_is_the_cell_it_names(name: str) -> None:
    figure = FIGURES[name]
    assert float(cell(figure.results, figure.row, figure.column)) == figure.value, figure


def units(text: str) -> list[str]:
    """A document's table rows, list items and paragraphs, code blocks left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if lines and all(line.startswith("|") for line in lines):
            out += lines
            continue
        item: list[str] = []
        for line in lines:
            if re.match(r"\s*(?:[-*]|\d+\.)\s", line) and item:
                out.append(" ".join(item))
                item = []
            item.append(line)
        out.append(" ".join(item))
    return out


def figures(unit: str) -> list[str]:
    """The numbers of a unit's figures (see the module's text)."""
    unit = re.sub(r"\[[^\]]*\]\([^)]*\)|`[^`]*`", " ", unit)  # links' and code's own digits
    return [n for run in RUN.findall(unit) for n in re.findall(NUMBER, run)]


def found(number: str, text: str) -> bool:
    """Whether ``text`` has ``number``: the same, or one with more decimals that rounds to
    it (a doc may quote 11.53 as 11.5), never as part of a longer number."""
    quoted = Decimal(number.replace(",", ""))
    places = Decimal(1).scaleb(quoted.as_tuple().exponent)  # type: ignore[arg-type]
    for match in re.finditer(rf"(?<![\d.,])(?:{NUMBER})(?![\d]|[.,]\d)", text):
        value = Decimal(match.group().replace(",", ""))
        if value == quoted or (
            value.as_tuple().exponent < quoted.as_tuple().exponent  # type: ignore[operator]
            and value.quantize(places, ROUND_HALF_UP) == quoted
        ):
            return True
    return False


def quoted() -> list[tuple[str, str, list[str]]]:
    """(document, unit, results files it links) for every unit that links one, or that
    belongs to a paragraph that does: a table's rows take the links of its caption (the
    paragraph just before it), and a list's items those of the paragraph that introduces
    it (one ending in a colon), when they link none of their own."""
    return [(doc.name, unit, links) for doc in DOCS for unit, links in linked(doc.read_text())]


def linked(text: str) -> list[tuple[str, list[str]]]:
    """(unit, the results files it cites) for the units of a document that cite one."""
    out = []
    caption: list[str] = []  # the links of the paragraph before, for a table
    intro: list[str] = []  # ... for a list, when it ends in a colon
    nested: list[tuple[int, list[str]]] = []  # items ending in a colon: (indent, links)
    for unit in units(text):
        own = sorted(set(LINK.findall(unit)))
        item = re.match(r"(\s*)(?:[-*]|\d+\.)\s", unit)
        if unit.startswith("|"):
            links = own or caption
        elif item:
            indent = len(item.group(1))
            while nested and nested[-1][0] >= indent:
                nested.pop()
            links = own or (nested[-1][1] if nested else intro)
            if unit.rstrip().endswith(":"):  # it introduces the items under it
                nested.append((indent, links))
        else:  # a paragraph (or a heading): its links go to what follows it
            links = own
            caption = own
            intro = own if unit.rstrip().endswith(":") else []
            nested = []
        if links:
            out.append((unit, links))
    return out


def test_the_docs_cite_results_files_that_exist() -> None:
    missing = {
        (doc, name)
        for doc, _, links in quoted()
        for name in links
        if not (ROOT / RESULTS / name).exists()
    }
    assert not missing, sorted(missing)


def named_rows(unit: str, texts: list[str]) -> list[str]:
    """A doc's table row whose first cell names a row of the results' tables (the same
    label): those rows, where its figures must be; else the whole files."""
    if not unit.startswith("|"):
        return texts
    label = unit.strip().strip("|").split("|")[0].strip()
    if not label or not re.search(r"[A-Za-z]", label):
        return texts
    rows = [
        line
        for text in texts
        for line in text.splitlines()
        if line.startswith("|") and line.strip().strip("|").split("|")[0].strip() == label
    ]
    return rows or texts


def test_each_quoted_figure_is_in_the_results_it_cites() -> None:
    wrong = []
    for doc, unit, links in quoted():
        # (a file that is not there is the test above's)
        texts = [(ROOT / RESULTS / n).read_text() for n in links if (ROOT / RESULTS / n).exists()]
        texts = named_rows(unit, texts)
        for number in figures(unit):
            if not any(found(number, text) for text in texts):
                wrong.append(f"{doc}: {number} not in {', '.join(links)}: {unit[:120]}")
    assert not wrong, "\n".join(wrong)


def test_a_changed_figure_fails_the_check() -> None:
    """The check can fail: a figure of the results, changed, is not found."""
    assert found("8.8", "| native | rest | off | 10 | 8 | 8,149 | 8.8 |")
    assert not found("8.8", "| native | rest | off | 10 | 8 | 8,149 | 8.9 |")
    assert not found("8.8", "18.8 and 8.86 and 8.74")
    assert found("8.8", "8.76")
    assert not found("8.8", "8.74")
    assert found("11.5", "11.53")
    assert not found("46,000", "46,048")
    assert figures("REST 9.7 / 7.4 µs, 26.4 to 28.2 µs and 1,471 B (batch 10)") == [
        "9.7",
        "7.4",
        "26.4",
        "28.2",
        "1,471",
    ]


def test_a_changed_figure_in_a_caption_linked_table_fails() -> None:
    """A table whose only link is its caption is checked against that file, row by row."""
    results = (
        "| cell | req/s | µs |\n|---|---:|---:|\n| rest | 8,149 | 8.8 |\n| grpc | 9,001 | 5.7 |\n"
    )
    doc = (
        "Measured (`benchmarks/results/x.md`):\n\n"
        "| cell | server CPU |\n|---|---:|\n| rest | {} µs |\n\nNext paragraph, 8.8 µs.\n"
    )
    for figure, passes in (("8.8", True), ("8.9", False), ("5.7", False)):
        (row,) = [(u, links) for u, links in linked(doc.format(figure)) if u.startswith("| rest")]
        assert row[1] == ["x.md"]  # the caption's link
        assert any(found(figure, r) for r in named_rows(row[0], [results])) is passes
    # the paragraph after the table cites nothing: its figure is not checked
    assert not [u for u, _ in linked(doc.format("8.8")) if u.startswith("Next")]


def test_a_row_s_figures_come_from_the_row_it_names() -> None:
    """A doc's table row that repeats a results row's label is checked against that row:
    the same number elsewhere in the file does not pass it."""
    results = "| a | 1.5 µs | 9 |\n| b | 2.5 µs | 9 |\n"
    assert named_rows("| b | 2.5 µs |", [results]) == ["| b | 2.5 µs | 9 |"]
    assert not any(found("1.5", row) for row in named_rows("| b | 1.5 µs |", [results]))
    assert named_rows("| c | 1.5 µs |", [results]) == [results]  # no such row: the file


def test_the_capacity_guide_shows_what_plan_prints() -> None:
    """docs/capacity.md's example is the command's output today, figures and sources."""
    text = (ROOT / "docs" / "capacity.md").read_text()
    example = re.search(r"```\n\$ feature-store (plan [^\n]*)\n(.*?)```", text, re.S)
    assert example is not None, "docs/capacity.md shows no `$ feature-store plan` example"
    done = subprocess.run(
        [sys.executable, "-m", "feature_store.cli", *example.group(1).split()],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == example.group(2)
