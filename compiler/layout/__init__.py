"""Tensor layouts in PFN's notation: parsing, placement on a chip, host scatter and gather."""

from .layout import (ADDRESS, TIME_AXIS, W_AXIS, Broadcast, Factor, Layout, has_lanes, lane_dims, lane_padding_dims,
                     lanes_innermost)
from .parse import parse
from .placement import Placement

__all__ = ["ADDRESS", "TIME_AXIS", "W_AXIS", "Broadcast", "Factor", "Layout", "Placement", "has_lanes", "lane_dims",
           "lane_padding_dims", "lanes_innermost", "parse"]
