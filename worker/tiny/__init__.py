"""Tiny local models and demo datasets for the demo, the examples and the tests."""

from worker.tiny.demo_data import make_demo_data
from worker.tiny.model import make_tiny_model

__all__ = ["make_demo_data", "make_tiny_model"]
