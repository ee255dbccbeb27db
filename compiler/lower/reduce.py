"""Reductions (sum, amax, amin over dimensions): placeholder until the reduction kernel lands."""
