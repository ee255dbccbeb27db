"""Hardware descriptions of MN-Core 2 and its variants, validated into typed objects.

    >>> import hwdesc
    >>> hw = hwdesc.load("mncore2")
    >>> hw.instances("PE")
    4096

Every hardware number mnsim uses comes from these YAML files; simulator and compiler code hold
none. `hwdesc.figures` derives peaks and bandwidths; `hwdesc.dump` writes a description back.
"""

from .errors import HwDescError, MnsimError, ReadOnlyError
from .loader import from_document, load, names
from .model import HwDesc
from .source import CONFIDENCE_TAGS, UNSOURCED, Location, Provenance

__all__ = ["CONFIDENCE_TAGS", "UNSOURCED", "HwDesc", "HwDescError", "Location", "MnsimError", "ReadOnlyError",
           "Provenance", "from_document", "load", "names"]
