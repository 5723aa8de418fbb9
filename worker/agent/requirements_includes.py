"""The files a requirements file pulls in with `-r` / `-c`, as pip resolves them: what the job
environment's digest must cover, or an edit to an included file would reuse a stale environment."""

from __future__ import annotations

import re
from pathlib import Path

# `-r x`, `--requirement x`, `-r=x`, `--requirement=x`, and the same for constraints (`-c`, `--constraint`).
_INCLUDE = re.compile(r"^(?:-r|--requirement|-c|--constraint)(?:\s*=\s*|\s+|(?=[^\s=-]))(\S+)")
# pip follows nesting without limit; a workspace's real files nest two or three deep.
MAX_DEPTH = 10
MAX_FILES = 100


def _included_names(text: str) -> list[str]:
    names = []
    for raw in text.replace("\\\n", "").splitlines():  # pip joins continued lines first
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        found = _INCLUDE.match(line)
        if found:
            names.append(found.group(1))
    return names


def included_files(requirements: Path) -> list[Path]:
    """`requirements` and every local file it includes, recursively, in the order pip meets them, once
    each. A name is relative to the file that names it (pip's rule); a URL or a missing file is left to
    pip (its text is part of the including file already). Bounded by MAX_DEPTH and MAX_FILES."""
    seen: list[Path] = []

    def visit(file: Path, depth: int) -> None:
        resolved = file.resolve()
        if resolved in seen or len(seen) >= MAX_FILES or not resolved.is_file():
            return
        seen.append(resolved)
        if depth >= MAX_DEPTH:
            return
        for name in _included_names(resolved.read_text(encoding="utf-8", errors="replace")):
            if "://" in name:
                continue
            visit(resolved.parent / name, depth + 1)

    visit(requirements, 0)
    return seen
