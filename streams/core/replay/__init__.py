"""Replay safety: what lets a resent or replayed event change nothing, with bounded memory.

===============  ================================================================================
``admission``    which events are too old, or too far ahead, to be applied
``records``      purchase outcomes and value marks: recall, keep, forget (their one writer)
``watermarks``   how far back each stream's records reach, kept in the stream's record
===============  ================================================================================

The handlers read: recall → fulfil or refuse → keep. Everything else about keeping records is
here.
"""

from .admission import Admission
from .records import Records

__all__ = ["Admission", "Records"]
