"""The frontend: a torch function traced into the compiler's primitive graph (compiler.ir)."""

from .tracing import key_name, trace, user_line

__all__ = ["key_name", "trace", "user_line"]
