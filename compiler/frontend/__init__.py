"""Tracing torch functions into mnsim's graph."""

from .graph import Graph, Node, Value
from .trace import trace

__all__ = ["Graph", "Node", "Value", "trace"]
