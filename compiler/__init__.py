"""placeholder package (filled by a later step)."""
