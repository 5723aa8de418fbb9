"""The dashboard: static pages that read the JSON API with the user's token (no server-side rendering).

GET / is the jobs page and GET /ui/jobs/{id} a job's live page (GET /jobs/{id} is the JSON API).
The pages take the job id from their own URL, so no request data is ever written into HTML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

STATIC_DIR = Path(__file__).resolve().parents[2] / "dashboard" / "static"
STATIC_PREFIX = "/ui/static"
# Scripts only from this origin: a recipe name holding markup can never run as code.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(tags=["dashboard"], include_in_schema=False)


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC_DIR / name, media_type="text/html", headers=_HEADERS)


@router.get("/")
def jobs_page() -> FileResponse:
    return _page("index.html")


@router.get("/ui/jobs/{job_id}")
def job_page(job_id: int) -> FileResponse:
    return _page("job.html")


class _GuardedStaticFiles(StaticFiles):
    """Static files with the pages' security headers: /ui/static/job.html is the same page as
    /ui/jobs/{id} and must not be framed or run other origins' scripts either."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(_HEADERS)
        return response


def static_files() -> StaticFiles:
    """The pages' scripts, styles and the vendored chart library, mounted at STATIC_PREFIX."""
    return _GuardedStaticFiles(directory=STATIC_DIR)
