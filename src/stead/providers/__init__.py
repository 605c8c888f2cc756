"""Model providers: the protocol (`base`), the deterministic `scripted` provider, and real drivers."""

from stead.providers.base import (
    BlockEnd,
    Done,
    Provider,
    ProviderRequest,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolSpec,
    UsageEvent,
)

__all__ = [
    "BlockEnd",
    "Done",
    "Provider",
    "ProviderRequest",
    "ReasoningDelta",
    "StreamEvent",
    "TextDelta",
    "ToolSpec",
    "UsageEvent",
]
