"""The HTTP API (FastAPI)."""
